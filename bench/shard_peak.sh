#!/usr/bin/env bash
# distributed.shard memory without checkpoints: each process's peak RSS (VmHWM;
# the launcher, then the ranks, sorted) for a 4-step fit of the deep MLP
# 784-W-W-W-W-10, and what a parameters run says of its gathers.
#   bench/shard_peak.sh PROCESSES MODE WIDTH [--set key=value ...]
set -uo pipefail
cd "$(dirname "$0")/.."
n=$1 mode=$2 w=$3 run=$(mktemp -d)/run
shift 3
trap 'rm -rf "$(dirname "$run")"' EXIT
build/bin/kiln fit bench/mlp256.toml -n "$n" --set run.threads=1 --set distributed.shard="$mode" \
  --set model.hidden="[$w,$w,$w,$w]" --set trainer.batch_size=32 --set trainer.max_epochs=1 \
  --set trainer.limit_train_batches=4 --set trainer.limit_val_batches=0 \
  --set trainer.test_after_fit=false --set checkpoint.enabled=false \
  --set run.dir="\"$run\"" --set trainer.progress=none "$@" > $run.log 2>&1 &
declare -A hwm=()
while kill -0 $! 2>/dev/null; do
  for p in $(pgrep -f "run.dir=\"$run\""); do
    v=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || true); [ -n "$v" ] && hwm[$p]=$v
  done; sleep 0.1
done
wait $! || { tail -5 $run.log; exit 1; }
echo "$n $mode W=$w: $(for p in "${!hwm[@]}"; do echo $((hwm[$p] / 1024)); done | sort -n | tr '\n' ' ') MB; $(grep -o '[0-9]* gathers.* of the [0-9]* bytes' $run.log | head -1)"
