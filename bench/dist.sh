#!/usr/bin/env bash
# Data-parallel scaling: the reference mlp256 (shared/bench-definition.md)
# with 1 worker process versus 2 (one intra-op thread each), alternating,
# median epoch time of each. Usage: bench/dist.sh [rounds]  (default 3)
# Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_fashion_mnist >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
epoch_seconds() {
  awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="epoch_seconds") c=i; next} c && $c!="" {print $c}' "$1"
}
: >"$out/p1"; : >"$out/p2"
for r in $(seq 1 "$rounds"); do
  for n in 1 2; do
    "$build/bin/kiln" fit bench/mlp256.toml -n "$n" --set run.threads=1 --set run.dir="$out/run$n" \
      --set trainer.test_after_fit=false >"$out/log$n" 2>&1 </dev/null
    epoch_seconds "$out/run$n/metrics.csv" >>"$out/p$n"
  done
done
t1=$(median <"$out/p1")
t2=$(median <"$out/p2")
awk -v a="$t1" -v b="$t2" -v n="$rounds" 'BEGIN {
  printf "mlp256, 1 thread per process: 1 process %.3f s/epoch (%.0f samples/s), 2 processes %.3f s/epoch (%.0f samples/s); throughput ratio %.2fx (medians of %d epochs each)\n",
         a, 60000/a, b, 60000/b, a/b, 3*n }'
