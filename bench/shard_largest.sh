#!/usr/bin/env bash
# The largest model this machine trains with Adam under distributed.shard =
# none, optimizer (ZeRO-1), gradients (ZeRO-2) and parameters (ZeRO-3:
# KILN_SHARD_MODES="... parameters"), at each process count.
# The model is a deep wide MLP on Fashion-MNIST, 784-W-W-W-W-10 (P = 3W^2 +
# 798W + 10 values), 1 thread a rank, batches of 32 (activations are a few MB
# at any width here), 1 epoch of 2 steps, no validation, no test, and no
# checkpoint at all (checkpoint.enabled = false: the training state alone,
# what docs/distributed.md's formula counts; KILN_SHARD_CHECKPOINT=1 keeps the
# final checkpoint a fit commits, which costs rank 0 more — the formula below
# then overcounts the other ranks). For each count and mode:
#  1. two widths (KILN_FIT_WIDTHS, default 3072 6144: P = 30.8 M and 118 M,
#     each layer past kiln's 32 MiB mmap threshold, so freed at once);
#     each process's peak RSS (VmHWM, read from /proc until it exits), and a
#     fit of the largest rank's peak = a + b P;
#  2. P_max such that N (a + b P_max) + the launcher's peak fits the budget
#     (KILN_BUDGET_GIB, default 19), and what the fit predicts for the whole
#     machine (MemTotal);
#  3. a run at P_max, the width rounded down to a multiple of 64, which has to
#     finish; its measured sum of peaks (launcher and ranks).
# No size is launched whose predicted sum exceeds the budget (the two fit
# widths against 16P + 400 MB a rank, before there is a fit), and a run is
# killed, and the script stops with its log's tail, if its processes' RSS
# sums past the budget or MemAvailable falls under KILN_MIN_AVAILABLE_MIB
# (default 1024). Sums of VmHWM overcount: the
# ranks' peaks need not coincide, and the shared library pages each process
# maps are counted once per process.
# KILN_SHARD_PRECISION=bf16-true (default 32) trains in trainer.precision =
# "bf16-true": bfloat16 weights and gradients, float32 masters and moments
# (docs/training.md, "Precision"); the formula column follows it.
#   bench/shard_largest.sh [PROCESSES...]   (default: 2 4; KILN_SHARD_MODES to choose)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
[ -x "$build/bin/kiln" ] || { echo "no $build/bin/kiln: build kiln first" >&2; exit 1; }
budget_gib=${KILN_BUDGET_GIB:-19}
min_avail_kib=$(( ${KILN_MIN_AVAILABLE_MIB:-1024} * 1024 ))
read -r -a fit_widths <<<"${KILN_FIT_WIDTHS:-3072 6144}"
[ ${#fit_widths[@]} -eq 2 ] || { echo "KILN_FIT_WIDTHS: two widths" >&2; exit 1; }
checkpoint=false
[ "${KILN_SHARD_CHECKPOINT:-0}" = 1 ] && checkpoint=true
procs=("$@")
[ ${#procs[@]} -gt 0 ] || procs=(2 4)
modes=(${KILN_SHARD_MODES:-none optimizer gradients})
precision=${KILN_SHARD_PRECISION:-32}
case "$precision" in 32|bf16-true) ;; *) echo "KILN_SHARD_PRECISION: 32 or bf16-true" >&2; exit 1 ;; esac
budget=$(awk -v g="$budget_gib" 'BEGIN {printf "%.0f", g * 1024 ^ 3}')
total=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
. bench/peak_watch.sh
private_kiln "$build"

params() { echo $((3 * $1 * $1 + 798 * $1 + 10)); }
# The largest width (a multiple of 64) whose P is at most $1.
# The P whose predicted sum, N (a + b P) + the launcher, is $1 bytes.
pmax() { awk -v B="$1" -v n="$n" -v l="$launcher_b" -v a="$a" -v b="$b" 'BEGIN {printf "%.0f", ((B - l) / n - a) / b}'; }
width_for() { awk -v p="$1" 'BEGIN {w = int((-798 + sqrt(798 ^ 2 + 12 * (p - 10))) / 6); print w - w % 64}'; }

# run N MODE W: trains, samples VmHWM; sets launcher_kib, max_kib, sum_kib
# (launcher and ranks), peaks_mb (each process, launcher first) and secs.
run() {
  local n=$1 mode=$2 w=$3
  local run="$out/$n.$mode.$w.run" log="$out/$n.$mode.$w.log" start=$SECONDS
  "$kiln" fit bench/mlp256.toml -n "$n" --set run.threads=1 --set distributed.shard="$mode" \
    --set trainer.precision="\"$precision\"" \
    --set model.hidden="[$w,$w,$w,$w]" --set trainer.batch_size=32 --set trainer.max_epochs=1 \
    --set trainer.limit_train_batches=2 --set trainer.limit_val_batches=0 \
    --set trainer.test_after_fit=false --set checkpoint.enabled="$checkpoint" \
    --set checkpoint.every_n_epochs=0 --set run.dir="$run" --set trainer.progress=none >"$log" 2>&1 &
  local launcher=$! p
  local -A hwm=()
  watch_peaks "$launcher" "run.dir=$run" "$budget" "$min_avail_kib" "$log" "$n processes, $mode, width $w"
  wait "$launcher" || { echo "kiln failed at $n processes, $mode, width $w: $log" >&2; tail -30 "$log" >&2; exit 1; }
  secs=$((SECONDS - start))
  launcher_kib=${hwm[$launcher]:-0}
  unset "hwm[$launcher]"
  [ ${#hwm[@]} -eq "$n" ] || { echo "saw ${#hwm[@]} ranks of $n at $mode, width $w" >&2; exit 1; }
  max_kib=0 sum_kib=$launcher_kib
  for p in "${!hwm[@]}"; do
    sum_kib=$((sum_kib + hwm[$p]))
    [ "${hwm[$p]}" -gt "$max_kib" ] && max_kib=${hwm[$p]}
  done
  peaks_mb="$((launcher_kib / 1024)), $(for p in "${!hwm[@]}"; do echo $((hwm[$p] / 1024)); done | sort -n | paste -sd, - | sed 's/,/, /g')"
}

echo "precision $precision; budget $budget_gib GiB (MemTotal $(awk -v t="$total" 'BEGIN {printf "%.1f", t / 1024 ^ 3}') GiB); final checkpoint: $checkpoint; fit widths ${fit_widths[*]}"
table=()
for n in "${procs[@]}"; do
  p_none=
  for mode in "${modes[@]}"; do
    ys=() ps=() launcher_max=0
    for w in "${fit_widths[@]}"; do
      p=$(params "$w")
      prior=$((n * (16 * p + 400 * 1024 * 1024) + 200 * 1024 * 1024))
      [ "$prior" -le "$budget" ] || { echo "fit width $w at $n processes may not fit the budget" >&2; exit 1; }
      run "$n" "$mode" "$w"
      echo "  $n $mode width $w (P $p): VmHWM MB $peaks_mb (${secs} s)"
      ys+=($((max_kib * 1024))) ps+=("$p")
      [ "$launcher_kib" -gt "$launcher_max" ] && launcher_max=$launcher_kib
    done
    launcher_b=$((launcher_max * 1024))
    read -r a b <<<"$(awk -v p1="${ps[0]}" -v p2="${ps[1]}" -v y1="${ys[0]}" -v y2="${ys[1]}" \
      'BEGIN {b = (y2 - y1) / (p2 - p1); printf "%.0f %.4f", y1 - b * p1, b}')"
    p_budget=$(pmax "$budget") p_total=$(pmax "$total")
    w=$(width_for "$p_budget")
    p=$(params "$w")
    predicted=$(awk -v n="$n" -v l="$launcher_b" -v a="$a" -v b="$b" -v p="$p" 'BEGIN {printf "%.0f", n * (a + b * p) + l}')
    [ "$predicted" -le "$budget" ] || { echo "width $w predicted over the budget" >&2; exit 1; }
    echo "  $n $mode: a $((a / 1024 / 1024)) MB, b $b bytes/value; P_max $((p_budget / 1000000)) M in $budget_gib GiB, $((p_total / 1000000)) M in MemTotal; running width $w (P $p)"
    run "$n" "$mode" "$w"
    sum_gib=$(awk -v s="$sum_kib" 'BEGIN {printf "%.2f", s / 1024 ^ 2}')
    echo "  $n $mode width $w: VmHWM MB $peaks_mb, sum $sum_gib GiB (predicted $(awk -v s="$predicted" 'BEGIN {printf "%.2f", s / 1024 ^ 3}')) (${secs} s)"
    [ "$mode" = none ] && p_none=$p
    ratio=$([ -n "$p_none" ] && awk -v p="$p" -v q="$p_none" 'BEGIN {printf "%.2fx", p / q}' || echo -)
    # float32: 4 (weights) + 4 (gradients) + 8 (moments); bf16-true: 2 + 2 +
    # 4 (master) + 4 (its float32 gradient) + 8, the reduced gradients
    # float32 (4/N) where sharded.
    formula=$(awk -v n="$n" -v m="$mode" -v bf="$([ "$precision" = bf16-true ] && echo 1 || echo 0)" 'BEGIN {
      if (bf) print (m == "none") ? 20 : (m == "optimizer") ? 4 + 16 / n : (m == "gradients") ? 2 + 16 / n : 18 / n
      else print (m == "none") ? 16 : (m == "optimizer") ? 8 + 12 / n : (m == "gradients") ? 4 + 12 / n : 16 / n }')
    table+=("$(printf "| %s | %s | %.1f (%s) | %d | %d (%.1f M) | %.1f M | %s | %s |" "$n" "$mode" "$b" "$formula" \
      $((a / 1024 / 1024)) "$w" "$(awk -v p="$p" 'BEGIN {print p / 1e6}')" \
      "$(awk -v p="$p_total" 'BEGIN {print p / 1e6}')" "$sum_gib" "$ratio")")
  done
done
echo
echo "| processes | shard | b: bytes/value a rank (formula) | a: MB a rank | largest run: width (P) | P fitted to MemTotal | sum of peaks GiB | P vs none |"
echo "|---|---|---|---|---|---|---|---|"
printf "%s\n" "${table[@]}"
