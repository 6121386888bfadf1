#!/usr/bin/env bash
# Cost curves: seconds per epoch against batch size for the reference mlp256
# (shared/bench-definition.md) through the hand-written loop, kiln in one
# process and kiln in two (data parallel, `-n 2`), one intra-op thread per
# process. Sides alternate within each round (the side that goes first
# rotates), every run is 3 full epochs of the 60000 training samples, and the
# figures are medians over rounds x epochs.
#
#   bench/cost_curve.sh [rounds] [batch sizes...]   (default: 3 rounds; 32 64 128 256 512 1024)
#
# Writes bench/cost_curve.csv (medians), bench/cost_curve_epochs.csv (every
# epoch) and bench/cost_curve.png (bench/cost_curve.py), and prints the table.
# Plotting needs matplotlib (Debian python3-matplotlib, installed here if
# missing; PYTHON=... to use another interpreter); kiln itself never needs
# Python. Set COST_CURVE_OUT=DIR to write elsewhere. Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
if [ $# -gt 0 ]; then batches=("$@"); else batches=(32 64 128 256 512 1024); fi
build=${KILN_BUILD_DIR:-build}
out_dir=${COST_CURVE_OUT:-bench}

# Debian's python3-matplotlib is for Debian's python3: /usr/bin/python3, not
# whatever python3 comes first on PATH (pyenv, a virtual environment).
py=${PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=python3
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
  echo "installing python3-matplotlib (for the plot only)" >&2
  apt_get=(apt-get)
  [ "$(id -u)" = 0 ] || apt_get=(sudo apt-get)
  "${apt_get[@]}" install -y --no-install-recommends python3-matplotlib >/dev/null
fi

cmake --build "$build" -j2 --target kiln bench_hand_loop kiln_mlp kiln_fashion_mnist >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

epochs_csv="$work/epochs.csv"
echo "side,processes,batch,round,epoch,seconds" >"$epochs_csv"
kiln_epochs() {  # metrics.csv -> one epoch_seconds per line
  awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="epoch_seconds") c=i; next} c && $c!="" {print $c}' "$1"
}

# One side at one batch size: appends its epochs to the CSV.
run_side() {
  local side=$1 batch=$2 round=$3 log="$work/log" n
  failed() { echo "$side at batch $batch failed:" >&2; tail -5 "$log" >&2; exit 1; }
  if [ "$side" = hand ]; then
    "$build/bin/bench_hand_loop" mlp256 1 --batch "$batch" >"$log" 2>&1 </dev/null || failed
    awk -v b="$batch" -v r="$round" '$1=="epoch" && $3=="seconds" {print "hand,1," b "," r "," $2 "," $4}' \
      "$log" >>"$epochs_csv"
  else
    n=${side#kiln}
    rm -rf "$work/run"
    "$build/bin/kiln" fit bench/mlp256.toml -n "$n" --set run.threads=1 --set trainer.batch_size="$batch" \
      --set trainer.test_after_fit=false --set run.dir="$work/run" >"$log" 2>&1 </dev/null || failed
    kiln_epochs "$work/run/metrics.csv" | awk -v n="$n" -v b="$batch" -v r="$round" \
      '{print "kiln," n "," b "," r "," NR-1 "," $1}' >>"$epochs_csv"
  fi
}

sides=(hand kiln1 kiln2)
start=$(date +%s)
turn=0
for r in $(seq 1 "$rounds"); do
  for b in "${batches[@]}"; do
    # Rotate which side goes first, so no side always runs on a machine the
    # previous one left warm (or hot).
    for k in 0 1 2; do
      run_side "${sides[$(((k + turn) % 3))]}" "$b" "$r"
    done
    turn=$((turn + 1))
  done
  echo "round $r/$rounds done ($(($(date +%s) - start)) s, load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
done

mkdir -p "$out_dir"
cp "$epochs_csv" "$out_dir/cost_curve_epochs.csv"
"$py" bench/cost_curve.py "$out_dir/cost_curve_epochs.csv" "$out_dir/cost_curve.csv" "$out_dir/cost_curve.png" \
  --note "$(date -u +%Y-%m-%d), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) at the end, rounds: $rounds"
