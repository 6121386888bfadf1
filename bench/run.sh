#!/usr/bin/env bash
# kiln versus a hand-written LibTorch loop on the reference benchmark
# (shared/bench-definition.md), alternating the two in one run (the side that
# goes first swaps every round) and quoting medians. kiln runs with its
# defaults on: progress lines, metrics.csv, a checkpoint each epoch
# (bench/mlp*.toml), trainer.data_workers = auto.
# Usage: bench/run.sh [rounds] [threads...]   (default: 3 rounds, 1 2)
#        KILN_BENCH_EACH=1 bench/run.sh ...   also prints each round's epochs
#        KILN_BENCH_SET="optimizer.fused=true" bench/run.sh ...   kiln with these --set overrides
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

median() {  # of numbers only: anything else is a parsing bug, not a time
  sort -g | awk '$1 !~ /^[0-9.eE+-]+$/ {print "bench/run.sh: not a number: " $1 > "/dev/stderr"; exit 1}
    {a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'
}
peak_kb() { awk -F: '/Maximum resident/ {gsub(/ /, "", $2); print $2}' "$1"; }

run_hand() {  # model threads
  /usr/bin/time -v -o "$out/hand.time" "$build/bin/bench_hand_loop" "$1" "$2" >"$out/hand.log" 2>&1
  # Only the "epoch N seconds S" lines: the "epoch 0 order starts" marker,
  # read as a number, sorted below every time and made the floor's "median"
  # its 33rd percentile (every ratio before 2026-11-27 17:30 was too high).
  awk '$1 == "epoch" && $3 == "seconds" {print $4}' "$out/hand.log" >>"$out/hand.$1.$2"
  peak_kb "$out/hand.time" >>"$out/hand.rss.$1.$2"
}
extra=()
for kv in ${KILN_BENCH_SET:-}; do extra+=(--set "$kv"); done
run_kiln() {  # model threads
  rm -rf "$out/run"
  /usr/bin/time -v -o "$out/kiln.time" "$build/bin/kiln" fit "bench/$1.toml" --set run.threads="$2" "${extra[@]}" \
    --set run.log_level=debug --set run.dir="$out/run" >"$out/kiln.log" 2>&1 </dev/null
  # Every epoch, and epochs 1 and 2 apart: the hand loop warms up on a
  # throw-away model before it times anything; kiln's epoch 0 is its
  # warm-up, a third of its epochs here.
  awk -F, -v all="$out/kiln.$1.$2" -v warm="$out/kiln.warm.$1.$2" '
    NR==1 {for(i=1;i<=NF;i++){if($i=="epoch_seconds") c=i; if($i=="epoch") e=i}; next}
    c && $c!="" {print $c >>all; if ($e>=1) print $c >>warm}' "$out/run/metrics.csv"
  peak_kb "$out/kiln.time" >>"$out/kiln.rss.$1.$2"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
rows=()
for model in mlp256 mlp32; do
  for t in "${threads[@]}"; do
    : >"$out/hand.$model.$t"; : >"$out/kiln.$model.$t"; : >"$out/kiln.warm.$model.$t"; : >"$out/hand.rss.$model.$t"; : >"$out/kiln.rss.$model.$t"; : >"$out/pair.$model.$t"
    for r in $(seq 1 "$rounds"); do
      if [ $((r % 2)) = 1 ]; then run_hand "$model" "$t"; run_kiln "$model" "$t"; else run_kiln "$model" "$t"; run_hand "$model" "$t"; fi
      # Each round's pair, kiln's median epoch over the hand loop's: the two
      # ran seconds apart, so a pair mostly shares the VM's speed state
      # (which changes for seconds at a time), where the pooled medians
      # below mix rounds of either state in whatever proportion each side
      # happened to get.
      paste <(tail -3 "$out/kiln.$model.$t" | median) <(tail -3 "$out/hand.$model.$t" | median) |
        awk '{printf "%.6f\n", $1 / $2}' >>"$out/pair.$model.$t"
      # This VM changes speed for seconds at a time: a round's epochs show
      # whether both sides ran in the same state.
      if [ "${KILN_BENCH_EACH:-0}" = 1 ]; then
        echo "  $model $t round $r s/epoch: hand $(tail -3 "$out/hand.$model.$t" | tr '\n' ' ')| kiln $(tail -3 "$out/kiln.$model.$t" | tr '\n' ' ')"
      fi
      if [ "$r" = 1 ]; then
        echo "== $model, $t thread(s): like-for-like markers (hand loop | kiln)"
        grep -E 'initial parameter sum|order starts|last batch loss|test accuracy' "$out/hand.log" | sed 's/^/  hand: /'
        grep -E 'initial parameter sum|order starts' "$out/kiln.log" | sed 's/.*debug /  kiln: /'
        grep -E 'epoch 2 batch' "$out/kiln.log" | tail -1 | sed 's/.*info /  kiln: last /'
        grep -E '^\S+ info test:' "$out/kiln.log" | sed 's/.*info /  kiln: /'
        grep -E 'BLAS' "$out/kiln.log" | sed 's/.*BLAS /  BLAS: /; s/, run dir.*//'
        grep -E 'trainer.data_workers = auto' "$out/kiln.log" | sed 's/.*info /  kiln: /' || true
      fi
    done
    hand_s=$(median <"$out/hand.$model.$t")
    kiln_s=$(median <"$out/kiln.$model.$t")
    warm_s=$(median <"$out/kiln.warm.$model.$t")
    hand_mb=$(median <"$out/hand.rss.$model.$t")
    kiln_mb=$(median <"$out/kiln.rss.$model.$t")
    pair=$(median <"$out/pair.$model.$t")
    rows+=("$(awk -v m="$model" -v t="$t" -v h="$hand_s" -v k="$kiln_s" -v w="$warm_s" -v p="$pair" -v hm="$hand_mb" -v km="$kiln_mb" 'BEGIN {
      printf "| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.0f / %.0f |", m, t, h, k, k/h, w/h, p, hm/1024, km/1024 }')")
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "medians of $((3 * rounds)) epochs per cell (kiln's epochs 1-2 only: $((2 * rounds))); paired: the median over $rounds rounds of each round's kiln / hand; peak RSS: median over rounds"
echo "| model | threads | hand loop s/epoch | kiln s/epoch | kiln / hand | kiln epochs 1-2 / hand | paired rounds | peak RSS MiB hand / kiln |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
