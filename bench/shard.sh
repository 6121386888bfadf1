#!/usr/bin/env bash
# distributed.shard = optimizer (ZeRO-1) and gradients (ZeRO-2) against the
# replicated path, in one run, on Fashion-MNIST with a wide MLP (784-2048-2048-10: 5.8 M values;
# Adam's moments 46 MB replicated), 1 thread a rank, 3 epochs of 60 batches of 128:
# each process's peak RSS (VmHWM, read from /proc until it exits: the
# launcher, then the ranks, sorted), the median epoch time, and what the run
# says each rank owns. KILN_SHARD_CHECKPOINTS=0: no epoch checkpoints (a
# fit still commits one at its end). KILN_SHARD_SET="key=value ...": more
# --set for every run (e.g. "distributed.bucket_mb=4 distributed.prefetch=false").
#   bench/shard.sh [PROCESSES...]      (default: 2 4; KILN_SHARD_MODES to choose)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_fashion_mnist >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
extra=()
for kv in ${KILN_SHARD_SET:-}; do extra+=(--set "$kv"); done
procs=("$@")
[ ${#procs[@]} -gt 0 ] || procs=(2 4)
printf "%-10s %-9s %-28s %16s\n" processes shard "VmHWM MB (each process)" "epoch (s, median)"
for n in "${procs[@]}"; do
  for mode in ${KILN_SHARD_MODES:-none optimizer gradients}; do
    log="$out/$n-$mode.log"
    run="$out/run-$n-$mode"
    "$build/bin/kiln" fit bench/mlp256.toml -n "$n" --set checkpoint.every_n_epochs="${KILN_SHARD_CHECKPOINTS:-1}" \
      --set model.hidden=[2048,2048] --set trainer.max_epochs=3 --set trainer.limit_train_batches=60 \
      --set trainer.test_after_fit=false --set distributed.shard="$mode" --set run.dir="$run" \
      --set trainer.progress=none "${extra[@]}" >"$log" 2>&1 &
    # Each process's peak (VmHWM), read until it exits: the launcher and every rank.
    declare -A hwm=()
    while kill -0 $! 2>/dev/null; do
      for p in $(pgrep -f "run.dir=$run"); do
        v=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
        [ -n "$v" ] && hwm[$p]=$v
      done
      sleep 0.2
    done
    wait $! || { echo "kiln failed: $log" >&2; cat "$log" >&2; exit 1; }
    peaks=$(for p in "${!hwm[@]}"; do echo $((hwm[$p] / 1024)); done | sort -n | tr '\n' ' ')
    unset hwm
    epoch=$(grep -o 'epoch [0-9]*/[0-9]* .*(\([0-9.]*\) s' "$log" | sed 's/.*(\([0-9.]*\) s/\1/' | sort -n |
      awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
    printf "%-10s %-9s %-28s %16s\n" "$n" "$mode" "$peaks" "$epoch"
    grep -o 'rank 0 holds .*' "$log" | head -1 | sed 's/^/           /' || true
  done
done
