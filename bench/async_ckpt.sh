#!/usr/bin/env bash
# What a checkpoint costs the step loop: synchronous commits, asynchronous
# commits (the default) and a plain torch.save of the same state from Python
# (Lightning's path), on charlm widened until its state — parameters and
# Adam's two moments — is 100 MB to 2 GB, built from the manifest alone.
#
#   bench/async_ckpt.sh                 # the curve and the 1 GB throughput runs (~25 min here)
#   bench/async_ckpt.sh curve 100 1000  # only the stall curve, at these sizes (MB)
#   bench/async_ckpt.sh throughput      # only the 1 GB throughput runs
#   KILN_BENCH_THREADS=1 bench/async_ckpt.sh throughput   # training on one core, the writer on the other
#
# The stall is the time the step loop stands still at a checkpoint: kiln's
# own debug line ("the step loop waited X ms"), the median over a run's
# checkpoints after the first. Throughput: optimizer steps per second over
# `kiln fit`'s loop ("fit: N steps in X s"), with a checkpoint every 100
# steps against none. Writes bench/async_ckpt.csv and bench/async_ckpt.png
# (bench/async_ckpt.py draws it, and times torch.save and an in-memory copy
# of the same bytes with Debian's python3-torch, the same 1.13 as kiln's
# LibTorch). Results: bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
what=${1:-all}
[ $# -gt 0 ] && shift
sizes=${*:-100 250 500 1000 2000}
cmake --build "$build" -j2 --target kiln kiln_charlm kiln_token_stream >/dev/null
for p in python3-torch python3-matplotlib; do
  dpkg -s "$p" >/dev/null 2>&1 || { echo "async_ckpt.sh: installing $p" >&2; apt-get install -y -q --no-install-recommends "$p" >/dev/null; }
done
work=$(mktemp -d "${TMPDIR:-/var/tmp}/kiln-async-ckpt.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Any bytes do: the model's speed does not depend on the text.
cat /usr/share/common-licenses/* /usr/share/common-licenses/* > "$work/text.txt"

# The width whose state (12 bytes a parameter: weights, Adam's exp_avg and
# exp_avg_sq) is about $1 MB with 8 layers: 12 d^2 parameters a layer.
width_for() { awk -v mb="$1" 'BEGIN { d = sqrt(mb * 1e6 / 12 / 96); d = int(d / 64 + 0.5) * 64; if (d < 64) d = 64; print d }'; }

manifest() {  # width, steps, every (0: none), async
  cat > "$work/run.toml" <<TOML
[run]
name = "ckpt-bench"
dir = "$work/run"
seed = 0
threads = ${KILN_BENCH_THREADS:-2}
[model]
path = "kiln_charlm"
vocab_size = 256
block_size = 16
n_layer = 8
n_head = 8
n_embd = $1
[data]
path = "kiln_token_stream"
file = "$work/text.txt"
token_bytes = 1
block_size = 16
val_fraction = 0.1
[trainer]
max_epochs = -1
max_steps = $2
batch_size = 1
check_val_every_n_epoch = 0
progress = "none"
[optimizer]
name = "adam"
lr = 1e-4
TOML
  if [ "$3" -gt 0 ]; then
    printf '[checkpoint]\nevery_n_steps = %s\nevery_n_epochs = 0\nsave_top_k = 1\nasync = %s\n' "$3" "$4" >> "$work/run.toml"
  fi
}

# Runs the manifest; prints "<median stall ms> <snapshot MB> <steps/s>
# <median wait for the previous write ms> <median snapshot ms>".
run_kiln() {
  rm -rf "$work/run"
  "$build/bin/kiln" --log-level debug fit "$work/run.toml" > "$work/log" 2>&1 || { tail -5 "$work/log" >&2; exit 1; }
  local stalls snap rate
  # The first checkpoint is left out (its snapshot buffers are the process's first).
  stalls=$(awk '/the step loop waited/ { for (i = 1; i <= NF; ++i) if ($i == "waited") print $(i + 1) }' "$work/log" |
           tail -n +2 | sort -n)
  [ -n "$stalls" ] || stalls=$(awk '/the step loop waited/ { for (i = 1; i <= NF; ++i) if ($i == "waited") print $(i + 1) }' "$work/log")
  snap=$(awk '/the step loop waited/ { for (i = 1; i <= NF; ++i) if ($i == "of") print $(i + 1) }' "$work/log" | tail -1)
  rate=$(awk '/fit: [0-9]+ steps in/ { for (i = 1; i <= NF; ++i) if ($i == "steps") printf "%.4f", $(i - 1) / $(i + 2) }' "$work/log")
  echo "$(median_of "$stalls") ${snap:-0} $rate $(median_of "$(field "write")") $(median_of "$(field "snapshot")")"
}

# The numbers after `word` on each checkpoint's line but the first, sorted.
field() {
  awk -v w="$1" '/the step loop waited/ { for (i = 1; i < NF; ++i) if ($i == w) print $(i + 1) }' "$work/log" |
    tail -n +2 | sort -n
}

median_of() {
  [ -n "$1" ] || { echo 0; return; }
  echo "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

csv=bench/async_ckpt.csv
if [ "$what" = all ] || [ "$what" = curve ]; then
  echo "mode,target_mb,snapshot_mb,stall_ms,previous_write_ms,snapshot_ms" > "$csv"
  for mb in $sizes; do
    d=$(width_for "$mb")
    for mode in sync async; do
      # Far enough apart that the previous write has ended: the stall is the snapshot's.
      manifest "$d" 31 10 "$([ $mode = async ] && echo true || echo false)"
      read -r stall snap _ previous copy < <(run_kiln)
      echo "$mode,$mb,$snap,$stall,$previous,$copy" | tee -a "$csv"
    done
  done
fi
if [ "$what" = all ] || [ "$what" = throughput ]; then
  d=$(width_for 1000)
  # Checkpoints at 100, 200, 300; the run ends at 350, after the last write
  # (fit's end waits for a write in flight, which is no checkpoint's cost).
  steps=${KILN_BENCH_STEPS:-350}
  out=bench/async_ckpt_throughput.csv
  echo "setting,steps,steps_per_s,stall_ms,snapshot_mb,previous_write_ms,snapshot_ms" > "$out"
  for setting in none sync async; do
    case $setting in
      none) manifest "$d" "$steps" 0 false ;;
      sync) manifest "$d" "$steps" 100 false ;;
      async) manifest "$d" "$steps" 100 true ;;
    esac
    read -r stall snap rate previous copy < <(run_kiln)
    echo "$setting,$steps,$rate,$stall,$snap,$previous,$copy" | tee -a "$out"
  done
fi
/usr/bin/python3 bench/async_ckpt.py "$work" $sizes
