#!/usr/bin/env bash
# Data-parallel scaling: the reference mlp256 (shared/bench-definition.md)
# with 1 worker process versus 2 (one intra-op thread each), kiln with its
# shared-memory gradient all-reduce (the default on one host) and with Gloo
# over loopback, and PyTorch's own DDP (bench/ddp_reference.py) measured the
# same way, all alternating in one run; medians of the epoch times.
# Usage: bench/dist.sh [rounds]  (default 3)
#   KILN_BENCH_PYTHON: a Python with torch for the DDP reference (default:
#   .venv-torch/bin/python if present, else python3; skipped without torch).
# Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_fashion_mnist >/dev/null
py=${KILN_BENCH_PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv-torch/bin/python ]; then py=.venv-torch/bin/python; else py=python3; fi
fi
"$py" -c "import torch" 2>/dev/null || { echo "dist.sh: no torch in $py: the DDP reference is skipped"; py=""; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
epoch_seconds() {
  awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="epoch_seconds") c=i; next} c && $c!="" {print $c}' "$1"
}
kiln_run() {  # name, processes, extra --set...
  local name=$1 n=$2
  shift 2
  "$build/bin/kiln" fit bench/mlp256.toml -n "$n" --set run.threads=1 --set run.dir="$out/$name" \
    --set trainer.test_after_fit=false --set run.log_level=debug "$@" >"$out/$name.log" 2>&1 </dev/null ||
    { echo "dist.sh: kiln ($name) failed:"; tail -5 "$out/$name.log"; exit 1; }
  epoch_seconds "$out/$name/metrics.csv" >>"$out/$name.times"
}
for side in kiln1 kiln2 gloo2 ddp1 ddp2; do : >"$out/$side.times"; done
for r in $(seq 1 "$rounds"); do
  kiln_run kiln1 1
  kiln_run kiln2 2
  kiln_run gloo2 2 --set distributed.intra_host=gloo
  if [ -n "$py" ]; then
    for n in 1 2; do
      "$py" bench/ddp_reference.py --processes "$n" >"$out/ddp$n.log" 2>&1
      awk '/^epoch/ {print $4}' "$out/ddp$n.log" >>"$out/ddp$n.times"
    done
  fi
done
grep -h "shared-memory all-reduce:" "$out/kiln2.log" | head -1 | sed 's/.*debug /rank 0, last round: /' || true
report() {  # label, 1-process times, 2-process times
  local t1 t2
  t1=$(median <"$out/$2.times")
  t2=$(median <"$out/$3.times")
  awk -v l="$1" -v a="$t1" -v b="$t2" -v n="$rounds" 'BEGIN {
    if (a == "nan" || b == "nan") { printf "%s: no figures\n", l; exit }
    printf "%-36s 1 process %.3f s/epoch (%.0f samples/s), 2 processes %.3f s/epoch (%.0f samples/s); ratio %.2fx (medians of %d epochs)\n",
           l ":", a, 60000/a, b, 60000/b, a/b, 3*n }'
}
report "kiln, shared memory (default)" kiln1 kiln2
report "kiln, intra_host = gloo" kiln1 gloo2
[ -n "$py" ] && report "PyTorch DDP (Gloo), $("$py" -c 'import torch; print(torch.__version__)')" ddp1 ddp2
exit 0
