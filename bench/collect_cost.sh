#!/usr/bin/env bash
# Whole-split metrics: what collecting costs (bench/README.md, "Whole-split
# metrics: gather-and-compute cost").
#
# `kiln validate` of an MLP (784-256-128-10, batch 128) on a Fashion-MNIST
# validation split of 10,000 samples, with 1 process (2 threads) and with 2
# processes (1 thread each), in three variants:
#   collect    examples/whole_split_metric: collects scores [N, 10] float32 and
#              target [N] int64, on_epoch_end computes AUROC, macro-F1 and the
#              confusion matrix
#   nocollect  the same plugin with collect = false (loss and accuracy only)
#   kiln_mlp   the shipped MLP (collects; on_epoch_end: macro-F1 and AUROC)
# Per run it reads
#   - the validation epoch (on_validation_start to on_validation_end, every
#     batch and the epoch end included) from the bench callback
#     build/bench/libkiln_bench_val_timer.so ("bench: validation epoch X ms");
#   - the epoch end from kiln's debug line "collected val rows: ...; agreed,
#     gathered and merged in A ms; on_epoch_end B ms" (rank 0's; the debug
#     level is set with run.log_level: `kiln --log-level debug` is overridden
#     by the manifest's level);
#   - the peak RSS from /usr/bin/time (%M: the largest of kiln's processes).
# The variants alternate within each round; the script prints medians.
#
# usage: bench/collect_cost.sh [ROUNDS]          (default 7)
# Build first: cmake --build build -j2 --target kiln kiln_fashion_mnist kiln_mlp \
#                kiln_example_whole_split_metric kiln_bench_val_timer
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
KILN=build/bin/kiln
TIMER=$PWD/build/bench/libkiln_bench_val_timer.so
for f in "$KILN" "$TIMER" build/lib/kiln/plugins/libkiln_example_whole_split_metric.so; do
  [[ -e $f ]] || { echo "missing $f: build it first (see the header of $0)" >&2; exit 2; }
done
[[ -x /usr/bin/time ]] || { echo "needs /usr/bin/time (apt-get install time)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/kiln-collect-cost.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

manifest() {  # variant threads -> path
  local variant=$1 threads=$2 model
  case $variant in
    collect) model=$'path = "kiln_example_whole_split_metric"\nfeatures = 784\nhidden = [256, 128]\nclasses = 10\ncollect = true' ;;
    nocollect) model=$'path = "kiln_example_whole_split_metric"\nfeatures = 784\nhidden = [256, 128]\nclasses = 10\ncollect = false' ;;
    kiln_mlp) model=$'path = "kiln_mlp"\nhidden = [256, 128]' ;;
  esac
  cat > "$WORK/$variant-$threads.toml" <<EOF
[run]
name = "collect-cost"
dir = "$WORK/run"
seed = 0
threads = $threads

[model]
$model

[data]
path = "kiln_fashion_mnist"
val_size = 10000      # the last 10,000 training images
normalize = false

[trainer]
batch_size = 128
progress = "none"

[[callbacks]]
path = "$TIMER"
EOF
  echo "$WORK/$variant-$threads.toml"
}

# One run: prints "<val epoch ms> <gather ms> <on_epoch_end ms> <peak RSS KiB>"
# (gather and on_epoch_end "-" when nothing was collected).
run_once() {  # variant processes threads
  local m out
  m=$(manifest "$1" "$3")
  rm -rf "$WORK/run"
  out=$(/usr/bin/time -f "peak_rss_kib %M" "$KILN" validate "$m" -n "$2" --set run.log_level=debug 2>&1) || {
    echo "$out" >&2; exit 1; }
  awk '
    /\[rank [1-9]/ { next }   # rank 0 (or the only process) speaks for the run
    /bench: validation epoch/ { for (i = 1; i <= NF; i++) if ($i == "epoch") val = $(i + 1) }
    /collected val rows:/ && gather == "" {
      for (i = 1; i <= NF; i++) { if ($i == "merged") gather = $(i + 2); if ($i == "on_epoch_end") hook = $(i + 1) } }
    /^peak_rss_kib/ { rss = $2 }
    /collected val rows:/ && line == "" { line = $0; sub(/.*collected/, "collected", line) }
    END { printf "%s %s %s %s\n", val, (gather == "" ? "-" : gather), (hook == "" ? "-" : hook), rss
          if (line != "") print line > "/dev/stderr" }' <<<"$out" 2>>"$WORK/lines.txt"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "kiln validate, Fashion-MNIST val 10000, MLP 784-256-128-10, batch 128; $ROUNDS rounds; $(date -Is)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS=$WORK/results.txt
: > "$RESULTS"
for round in $(seq 1 "$ROUNDS"); do
  for shape in "1 2" "2 1"; do
    set -- $shape
    for variant in nocollect collect kiln_mlp; do
      echo "$variant $1 $2 $(run_once "$variant" "$1" "$2")" >> "$RESULTS"
    done
  done
done

col() { awk -v v="$1" -v p="$2" -v c="$3" '$1 == v && $2 == p && $(c) != "-" { print $(c) }' "$RESULTS" | median; }
printf '\n%-10s %-5s %-14s %-14s %-16s %-9s %-14s\n' variant procs "val epoch ms" "gather ms" "on_epoch_end ms" share "peak RSS MiB"
for p in 1 2; do
  for variant in nocollect collect kiln_mlp; do
    val=$(col $variant $p 4) gather=$(col $variant $p 5) hook=$(col $variant $p 6) rss=$(col $variant $p 7)
    share=$(awk -v g="$gather" -v h="$hook" -v v="$val" 'BEGIN { if (g == "-") print "-"; else printf "%.1f %%", 100 * (g + h) / v }')
    printf '%-10s %-5s %-14s %-14s %-16s %-9s %-14s\n' $variant $p "$val" "$gather" "$hook" "$share" \
      "$(awk -v k="$rss" 'BEGIN { printf "%.1f", k / 1024 }')"
  done
done
echo
echo "share: (gather + on_epoch_end) / validation epoch, medians; the validation epoch includes both."
echo "kiln's debug line (rank 0), with rows and without:"
awk '!seen[$3 $4]++' "$WORK/lines.txt" | head -6
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "every run (variant processes threads val_ms gather_ms hook_ms rss_kib):"
cat "$RESULTS"
