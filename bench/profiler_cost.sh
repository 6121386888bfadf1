#!/usr/bin/env bash
# What [profiler] kind = "simple" costs a step: kiln's mlp256 (bench/mlp256.toml)
# with the profiler off and on, alternating in one run (the side that goes
# first swaps every round), medians of the timed epochs (epoch_seconds).
# Usage: bench/profiler_cost.sh [rounds] [threads] [model]   (default: 3 2 mlp256)
# Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
threads=${2:-2}
model=${3:-mlp256}
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_fashion_mnist >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
run() {  # kind
  rm -rf "$out/run"
  "$build/bin/kiln" fit "bench/$model.toml" --set run.threads="$threads" --set run.dir="$out/run" \
    --set profiler.kind="$1" --set trainer.test_after_fit=false >"$out/$1.log" 2>&1 </dev/null
  awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="epoch_seconds") c=i; next} c && $c!="" {print $c}' \
    "$out/run/metrics.csv" >>"$out/$1.s"
}
: >"$out/none.s"; : >"$out/simple.s"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then run none; run simple; else run simple; run none; fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
off=$(median <"$out/none.s")
on=$(median <"$out/simple.s")
grep -A14 'profile of the fit' "$out/simple.log" | sed 's/^\[[^]]*\] info //'
awk -v a="$off" -v b="$on" -v m="$model" -v t="$threads" -v n="$((3 * rounds))" 'BEGIN {
  printf "\n%s, %s thread(s), medians of %d epochs: off %.4f s/epoch, simple %.4f s/epoch, simple/off %.4f\n", m, t, n, a, b, b/a }'
