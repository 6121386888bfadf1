#!/usr/bin/env bash
# kiln_arrays against the built-in Fashion-MNIST module (issue 22): the same
# 60000 training and 10000 test images, once as the gzipped IDX files that
# kiln_fashion_mnist reads and once as .npy files (float32 x/255, int64
# labels) that kiln_arrays memory-maps, through bench/mlp256.toml (kiln's
# defaults, a checkpoint each epoch). The two runs see the same numbers: the
# script checks that both log the same test accuracy and loss, then compares
# seconds per epoch (medians over rounds, the sides alternating).
#
#   bench/arrays_vs_idx.sh [ROUNDS] [THREADS]      (default 3 rounds, 2 threads)
#
# Needs a build (./go build) and a Python with numpy (.venv-check, as ./go
# test makes it, or KILN_CHECK_PYTHON). Writes under build/bench-arrays/.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} threads=${2:-2}
build=${KILN_BUILD_DIR:-build}
py=${KILN_CHECK_PYTHON:-.venv-check/bin/python}
kiln="$build/bin/kiln"
out=$(realpath -m "$build/bench-arrays")
data=$out/npy
mkdir -p "$out"
[ -x "$kiln" ] || { echo "arrays_vs_idx: no $kiln (run ./go build)" >&2; exit 2; }

if [ ! -e "$data/test/y.npy" ]; then
  "$py" - "$data" <<'PY'
import gzip, os, sys, numpy as np
out, root = sys.argv[1], "/usr/share/datasets/fashion-mnist"
def idx(name):
    raw = gzip.open(f"{root}/{name}", "rb").read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)
for split, prefix in (("train", "train"), ("test", "t10k")):
    os.makedirs(f"{out}/{split}", exist_ok=True)
    x = idx(f"{prefix}-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255
    np.save(f"{out}/{split}/x.npy", x)
    np.save(f"{out}/{split}/y.npy", idx(f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
PY
fi

# The arrays side: bench/mlp256.toml with only its [data] table swapped.
sed -e '/^\[data\]/,/^\[trainer\]/c\[data]\npath = "kiln_arrays"\ntrain = ["'"$data"'/train/x.npy", "'"$data"'/train/y.npy"]\ntest = ["'"$data"'/test/x.npy", "'"$data"'/test/y.npy"]\ninput = "x"\ntarget = "y"\n\n[trainer]' \
  bench/mlp256.toml >"$out/arrays.toml"

run_side() {  # run_side SIDE ROUND
  local manifest=bench/mlp256.toml
  [ "$1" = arrays ] && manifest=$out/arrays.toml
  rm -rf "$out/run-$1"
  "$kiln" fit "$manifest" --set "run.dir=$out/run-$1" --set "run.threads=$threads" >"$out/$1.$2.log" 2>&1
  awk -F, 'NR==1{for(i=1;i<=NF;i++){if($i=="epoch_seconds")c=i; if($i=="test/acc")a=i; if($i=="test/loss")l=i} next}
           c && $c!="" {print $c > "/dev/stderr"} a && $a!="" {print $a, $l}' \
    "$out/run-$1/metrics.csv" 2>>"$out/$1.seconds" >"$out/$1.$2.test"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
rm -f "$out"/*.seconds
for round in $(seq 1 "$rounds"); do
  run_side fashion "$round"
  run_side arrays "$round"
  cmp -s "$out/fashion.$round.test" "$out/arrays.$round.test" ||
    { echo "arrays_vs_idx: the two sides' test numbers differ: $(cat "$out/fashion.$round.test") vs $(cat "$out/arrays.$round.test")" >&2; exit 1; }
done
f=$(median <"$out/fashion.seconds") a=$(median <"$out/arrays.seconds")
echo "threads $threads, $rounds rounds x 3 epochs, test acc/loss $(cat "$out/fashion.1.test") on both sides"
echo "kiln_fashion_mnist (IDX, uint8 in memory): $f s/epoch (median)"
echo "kiln_arrays (.npy float32, memory-mapped):  $a s/epoch (median)"
awk -v f="$f" -v a="$a" 'BEGIN {printf "arrays / fashion_mnist: %.3f\n", a / f}'
