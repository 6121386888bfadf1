#!/usr/bin/env bash
# kiln versus a hand-written LibTorch loop on the reference benchmark
# (shared/bench-definition.md), alternating the two in one run and quoting
# medians. Usage: bench/run.sh [rounds] [threads...]   (default: 3 rounds, 1 2)
# Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
if [ $# -gt 0 ]; then threads=("$@"); else threads=(1 2); fi
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln bench_hand_loop kiln_mlp kiln_fashion_mnist >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

for model in mlp256 mlp32; do
  for t in "${threads[@]}"; do
    : >"$out/hand.$model.$t"; : >"$out/kiln.$model.$t"
    for r in $(seq 1 "$rounds"); do
      /usr/bin/time -v "$build/bin/bench_hand_loop" "$model" "$t" >"$out/hand.log" 2>"$out/hand.time"
      grep '^epoch' "$out/hand.log" | awk '{print $4}' >>"$out/hand.$model.$t"
      /usr/bin/time -v -o "$out/kiln.time" "$build/bin/kiln" fit "bench/$model.toml" --set run.threads="$t" \
        --set run.log_level=debug --set run.dir="$out/run" >"$out/kiln.log" 2>&1 </dev/null
      awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="epoch_seconds") c=i; next} c && $c!="" {print $c}' \
        "$out/run/metrics.csv" >>"$out/kiln.$model.$t"
      if [ "$r" = 1 ]; then
        echo "== $model, $t thread(s): like-for-like markers (hand loop | kiln)"
        grep -E 'initial parameter sum|order starts|last batch loss|test accuracy' "$out/hand.log" | sed 's/^/  hand: /'
        grep -E 'initial parameter sum|order starts' "$out/kiln.log" | sed 's/.*debug /  kiln: /'
        grep -E 'epoch 2 batch' "$out/kiln.log" | sed 's/.*info /  kiln: last /'
        grep -E '^\S+ info test:' "$out/kiln.log" | sed 's/.*info /  kiln: /'
        grep -E 'BLAS' "$out/kiln.log" | sed 's/.*BLAS /  BLAS: /; s/, run dir.*//'
        echo "  peak RSS: hand$(awk -F: '/Maximum resident/ {print $2}' "$out/hand.time") kB," \
             "kiln$(awk -F: '/Maximum resident/ {print $2}' "$out/kiln.time") kB"
      fi
    done
    hand=$(median <"$out/hand.$model.$t")
    kiln=$(median <"$out/kiln.$model.$t")
    awk -v m="$model" -v t="$t" -v h="$hand" -v k="$kiln" -v n="$rounds" 'BEGIN {
      printf "%s threads=%s: hand %.3f s/epoch, kiln %.3f s/epoch (medians of %d epochs), kiln/hand = %.3f\n",
             m, t, h, k, 3*n, k/h }'
  done
done
