#!/usr/bin/env bash
# The largest Llama-style exported model (bench/shard_llama.py: transformers'
# LlamaForCausalLM, 8 layers, vocabulary 4096, by its hidden size H) each
# case trains with Adam under a memory budget per rank, as a GPU's memory
# is: full fine-tuning and a LoRA adapter (peft, r = 8 on q_proj and
# v_proj, the base frozen), float32 and bf16-true (exported in bfloat16),
# replicated and with sharded parameters, at 1, 2 and 4 processes.
# Each case is "PROCESSES:SHARD:PRECISION:LORA[:MASTERS]" (KILN_LLAMA_CASES;
# default below; MASTERS 0: bf16-true with trainer.master_weights = false,
# Lightning's bf16-true, the bfloat16 weights stepped with bfloat16
# moments). For each:
#  1. two sizes (KILN_LLAMA_FIT_H, default 768 1280: 58 M and 156 M values),
#     each process's peak RSS (VmHWM, read from /proc until it exits), and a
#     fit of the largest rank's peak = a + b P (P: the model's values, the
#     frozen base's included);
#  2. P_max = (R - a) / b for the budget per rank R (KILN_RANK_BUDGET_GIB,
#     default 4: 4 ranks take 16 GiB of this 23.5 GiB machine);
#  3. the largest H (a multiple of 128) within P_max exported and run to the
#     end: its largest rank's peak must be within R. A P_max past
#     KILN_LLAMA_MAX_VALUES (default 1.3e9: what this machine can export, the
#     archive holding three copies) is not run: the largest it can export
#     is, and its peak is compared with the fit's prediction.
# Batches of 1 x 16 tokens (activations of a few MB: the fit counts what
# scales with the model), 2 steps a rank, 1 thread a rank, no validation,
# no checkpoint (the training state alone). The last column compares each
# case's P_max with the replicated float32 full fine-tune's at 1 process
# (for LoRA: the replicated float32 LoRA's), the issue's targets: sharded
# parameters in bf16-true at 4 processes >= 6x; LoRA with sharded
# parameters at 4 processes >= 3.5x.
# KILN_LLAMA_LARGEST_H runs that H as the largest instead (its peak against
# the budget and the fit's prediction).
#   bench/shard_largest_llama.sh   (needs ./go build --torch wheel, and
#   transformers and peft in .venv-torch: ./go test --torch wheel installs them)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build-torch2}
py=${KILN_TORCH_PYTHON:-.venv-torch/bin/python}
[ -x "$build/bin/kiln" ] || { echo "no $build/bin/kiln: ./go build --torch wheel first" >&2; exit 1; }
rank_budget=$(awk -v g="${KILN_RANK_BUDGET_GIB:-4}" 'BEGIN {printf "%.0f", g * 1024 ^ 3}')
max_values=$(awk -v v="${KILN_LLAMA_MAX_VALUES:-1.3e9}" 'BEGIN {printf "%.0f", v}')
min_avail_kib=$(( ${KILN_MIN_AVAILABLE_MIB:-1024} * 1024 ))
read -r -a fit_h <<<"${KILN_LLAMA_FIT_H:-768 1280}"
read -r -a cases <<<"${KILN_LLAMA_CASES:-1:none:32:0 2:parameters:32:0 4:parameters:32:0 1:none:bf16-true:0 4:parameters:bf16-true:0 4:parameters:bf16-true:0:0 1:none:32:1 4:parameters:32:1 4:parameters:bf16-true:1}"
. bench/peak_watch.sh
private_kiln "$build"

values() { "$py" bench/shard_llama.py count "$1" | awk '{print $2}'; }
# export H PRECISION LORA: the archive's directory (one export kept at a time
# beyond the two fit sizes', which every case of a precision and LoRA shares).
export_model() {
  local dir="$out/m.$1.$2.$3"
  if [ ! -f "$dir/model.pt2" ]; then
    mkdir -p "$dir"
    "$py" bench/shard_llama.py export "$dir" "$1" "$2" "$3" python >"$dir/export.log" 2>&1 ||
      { echo "export of H $1 failed:" >&2; tail -5 "$dir/export.log" >&2; exit 1; }
  fi
  echo "$dir"
}

# run N SHARD PRECISION DIR MASTERS: trains, samples VmHWM; sets max_kib (the
# largest rank's), peaks_mb (each rank's) and secs.
run() {
  local n=$1 mode=$2 precision=$3 dir=$4 masters=$5
  local run="$out/run.$n.$mode.$precision.$RANDOM" start=$SECONDS
  cat >"$run.toml" <<TOML
[run]
name = "llama"
dir = "$run"
seed = 0
threads = 1
[model]
path = "kiln_exported"
program = "$dir/model.pt2"
[data]
path = "kiln_arrays"
train = "$dir/train.safetensors"
[trainer]
max_epochs = 1
batch_size = 1
limit_train_batches = 2
limit_val_batches = 0
test_after_fit = false
shuffle = false
data_workers = 0
progress = "none"
precision = "$precision"
master_weights = $([ "$masters" = 0 ] && echo false || echo true)
[optimizer]
name = "adam"
lr = 0.0001
[distributed]
shard = "$mode"
[checkpoint]
enabled = false
TOML
  "$kiln" fit "$run.toml" -n "$n" >"$run.log" 2>&1 </dev/null &
  local launcher=$! p
  local -A hwm=()
  watch_peaks "$launcher" "$run" $((n * rank_budget + 1024 * 1024 * 1024)) "$min_avail_kib" "$run.log" \
    "$n processes, $mode, $precision"
  wait "$launcher" || { echo "kiln failed at $n processes, $mode, $precision: $run.log" >&2; tail -30 "$run.log" >&2; exit 1; }
  secs=$((SECONDS - start))
  # One process trains in the launcher itself; more in workers of its own.
  local own=${hwm[$launcher]:-0}
  unset "hwm[$launcher]"
  [ ${#hwm[@]} -eq 0 ] && [ "$n" -eq 1 ] && hwm[$launcher]=$own
  [ ${#hwm[@]} -eq "$n" ] || { echo "saw ${#hwm[@]} ranks of $n" >&2; exit 1; }
  max_kib=0
  for p in "${!hwm[@]}"; do [ "${hwm[$p]}" -gt "$max_kib" ] && max_kib=${hwm[$p]}; done
  peaks_mb="$(for p in "${!hwm[@]}"; do echo $((hwm[$p] / 1024)); done | sort -n | paste -sd, - | sed 's/,/, /g')"
  rm -rf "$run" "$run.log" "$run.toml"
}

echo "budget $(awk -v b="$rank_budget" 'BEGIN {printf "%.2f", b / 1024 ^ 3}') GiB a rank; fit sizes H ${fit_h[*]}"
table=()
declare -A base=()
for c in "${cases[@]}"; do
  IFS=: read -r n mode precision lora masters <<<"$c"
  masters=${masters:-1}
  ys=() ps=()
  for h in "${fit_h[@]}"; do
    dir=$(export_model "$h" "$precision" "$lora")
    p=$(values "$h")
    run "$n" "$mode" "$precision" "$dir" "$masters"
    echo "  $c H $h (P $p): rank VmHWM MB $peaks_mb (${secs} s)"
    ys+=($((max_kib * 1024))) ps+=("$p")
  done
  read -r a b <<<"$(awk -v p1="${ps[0]}" -v p2="${ps[1]}" -v y1="${ys[0]}" -v y2="${ys[1]}" \
    'BEGIN {b = (y2 - y1) / (p2 - p1); printf "%.0f %.4f", y1 - b * p1, b}')"
  p_max=$(awk -v r="$rank_budget" -v a="$a" -v b="$b" 'BEGIN {printf "%.0f", (r - a) / b}')
  # Past the cap, the largest model this machine exports is run instead:
  # its peak against the fit's prediction checks the fit far from its sizes.
  capped=$([ "$p_max" -gt "$max_values" ] && echo 1 || echo 0)
  h=$("$py" bench/shard_llama.py width "$([ "$capped" = 1 ] && echo "$max_values" || echo "$p_max")")
  # KILN_LLAMA_LARGEST_H: run this H instead (a size the fit does not pick).
  h=${KILN_LLAMA_LARGEST_H:-$h}
  p=$(values "$h")
  dir=$(export_model "$h" "$precision" "$lora")
  run "$n" "$mode" "$precision" "$dir" "$masters"
  rm -rf "$dir"
  within=$([ $((max_kib * 1024)) -le "$rank_budget" ] && echo within || echo "PAST")
  predicted=$(awk -v a="$a" -v b="$b" -v p="$p" 'BEGIN {printf "%.0f", (a + b * p) / 1048576}')
  largest="H $h ($(awk -v p="$p" 'BEGIN {printf "%.0f", p / 1e6}') M): $((max_kib / 1024)) MB, $within"
  [ "$capped" = 1 ] && largest="P_max past the ${KILN_LLAMA_MAX_VALUES:-1.3e9} values this machine exports; at H $h ($(awk -v p="$p" 'BEGIN {printf "%.0f", p / 1e6}') M): $((max_kib / 1024)) MB (the fit: $predicted)"
  echo "  $c $([ "$capped" = 1 ] && echo "capped" || echo largest) run H $h (P $p): rank VmHWM MB $peaks_mb (${secs} s; the fit: $predicted MB)"
  key=$lora
  [ "$n" = 1 ] && [ "$mode" = none ] && [ "$precision" = 32 ] && base[$key]=$p_max
  ratio=$([ -n "${base[$key]:-}" ] && awk -v p="$p_max" -v q="${base[$key]}" 'BEGIN {printf "%.2fx", p / q}' || echo -)
  table+=("$(printf "| %s | %s | %s | %s | %.2f | %d | %.0f M | %s | %s |" "$n" "$mode" \
    "$precision$([ "$masters" = 0 ] && echo ", no masters")" \
    "$([ "$lora" = 1 ] && echo LoRA || echo full)" "$b" $((a / 1024 / 1024)) \
    "$(awk -v p="$p_max" 'BEGIN {print p / 1e6}')" "$largest" "$ratio")")
  echo "  $c: a $((a / 1024 / 1024)) MB, b $b bytes/value; P_max $((p_max / 1000000)) M"
done
echo
echo "| processes | shard | precision | tuning | b: bytes/value a rank | a: MB a rank | P_max in the budget | largest run: H (P), its largest rank's peak | P_max vs replicated float32 at 1 process |"
echo "|---|---|---|---|---|---|---|---|---|"
printf "%s\n" "${table[@]}"
