#!/usr/bin/env bash
# Crash soak: SIGKILL `kiln fit` at random moments while ~51 MB checkpoints
# are written every step, N times (default 500), checking after each kill that
# every visible checkpoint is complete and valid, then that resume works.
# The test suite runs 50 such trials (CheckpointCrash); this is the long one.
# Usage: bench/ckpt_soak.sh [trials]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-500}
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_synthetic >/dev/null
dir=$(mktemp -d)
trap '[ "${keep:-0}" = 1 ] && echo "kept $dir for inspection" || rm -rf "$dir"' EXIT
cat >"$dir/run.toml" <<TOML
[run]
name = "soak"
dir = "$dir/run"
threads = 1
[model]
path = "kiln_mlp"
in_features = 32
hidden = [2048, 2048]
classes = 4
[data]
path = "kiln_synthetic"
features = 32
classes = 4
[trainer]
max_epochs = 100000
batch_size = 32
progress = "none"
[checkpoint]
every_n_steps = 1
TOML
mid_write=0; bad=0
for i in $(seq 1 "$trials"); do
  resume=""
  [ -e "$dir/run/checkpoints/last.ckpt" ] && resume="--resume last"
  "$build/bin/kiln" fit "$dir/run.toml" $resume >"$dir/trial.log" 2>&1 &
  pid=$!
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", 0.9 + (r % 1600) / 1000 }')"
  if ! kill -KILL $pid 2>/dev/null; then
    echo "trial $i: kiln exited before the kill:"; tail -3 "$dir/trial.log"; bad=$((bad + 1)); keep=1
  fi
  wait $pid 2>/dev/null || true
  [ -d "$dir/run/checkpoints" ] || continue
  ls -A "$dir/run/checkpoints" | grep -q '^\.' && mid_write=$((mid_write + 1))
  for f in "$dir"/run/checkpoints/*.ckpt; do
    [ -e "$f" ] || continue
    if ! out=$("$build/bin/kiln" inspect "$f" 2>&1); then
      echo "trial $i: INVALID $f: $out"; bad=$((bad + 1)); keep=1
    fi
  done
done
"$build/bin/kiln" fit "$dir/run.toml" --resume last --set trainer.max_epochs=100000 \
  --set trainer.max_steps=$(( $("$build/bin/kiln" inspect "$dir/run/checkpoints/last.ckpt" | awk '/global step/ {print $3}') + 1 )) \
  >/dev/null 2>&1 && resumed=ok || resumed=FAILED
echo "$trials trials: $mid_write killed mid-write (left a temporary), $bad invalid checkpoints, final resume $resumed"
[ "$bad" -eq 0 ] && [ "$resumed" = ok ]
