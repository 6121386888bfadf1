#!/usr/bin/env bash
# A Llama-style model (RoPE, RMSNorm, grouped-query attention; 4 layers of
# 256, vocabulary 2048, 8 x 128 tokens a step) from transformers, exported
# and trained by kiln (kiln_exported) against the same model in an eager
# PyTorch loop on the same LibTorch (the torch wheel's), the same threads,
# in one run, alternating; medians of the steps after the first 5. Then the
# interpreter's share of kiln's instructions (callgrind, 6 steps) and the
# peak RSS with and without [model] activation_checkpointing.
# Usage: bench/hf_llama.sh [rounds] [threads]   (needs ./go build --torch wheel
# and transformers: pip install -r examples/hugging_face/requirements.txt)
# Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
threads=${2:-2}
build=${KILN_BUILD_DIR:-build-torch2}
py=${KILN_TORCH_PYTHON:-.venv-torch/bin/python}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
"$py" bench/hf_llama.py export "$out" python 2>/dev/null
manifest() {  # name extra-model-lines batch
  cat >"$out/$1.toml" <<TOML
[run]
name = "$1"
dir = "$out/$1"
seed = 0
threads = $threads
[model]
path = "kiln_exported"
program = "$out/model.pt2"
$2
[data]
path = "kiln_arrays"
train = "$out/train.safetensors"
[trainer]
max_epochs = 1
batch_size = $3
shuffle = false
data_workers = 0
log_every_n_steps = 1
progress = "none"
[optimizer]
name = "sgd"
lr = 0.01
[logging]
loggers = ["jsonl"]
TOML
}
kiln_steps() {  # manifest -> step milliseconds after the first 5
  rm -rf "$out/$(basename "$1" .toml)"
  "$build/bin/kiln" fit "$1" >"$out/kiln.log" 2>&1 </dev/null
  grep '"kind":"step"' "$out/$(basename "$1" .toml)/metrics.jsonl" |
    sed 's/.*"train\/step_time_step":\([0-9.e-]*\).*/\1/' | tail -n +6 | awk '{print $1 * 1000}'
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
manifest plain "" 8
: >"$out/kiln"; : >"$out/eager"
for r in $(seq 1 "$rounds"); do
  kiln_steps "$out/plain.toml" >>"$out/kiln"
  "$py" bench/hf_llama.py eager "$out" "$threads" 40 2>/dev/null | awk '$1=="step_ms" {print $2}' | tail -n +6 >>"$out/eager"
done
k=$(median <"$out/kiln"); e=$(median <"$out/eager")
printf 'step ms (%s threads, %s steps each): kiln %.1f  eager %.1f  kiln/eager %.3f\n' "$threads" "$(wc -l <"$out/kiln")" "$k" "$e" \
  "$(echo "$k / $e" | bc -l)"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# The interpreter's share, in instructions (callgrind counts them the same
# on a busy machine), inside the step loop only, 3 steps of one row (the
# same 203-node graph; a step of 8 rows takes ~10 minutes under callgrind),
# one thread: GraphProgram::run's inclusive count less the operators' (the
# boxed dispatcher calls it makes) is the interpreter's own work.
manifest short "" 1
sed -i 's/^max_epochs = 1$/max_epochs = 1\nmax_steps = 3/' "$out/short.toml"
valgrind --tool=callgrind --collect-atstart=no "--toggle-collect=kiln::TrainingEpochLoop::run*" \
  --callgrind-out-file="$out/cg.out" "$build/bin/kiln" fit "$out/short.toml" --set run.threads=1 >/dev/null 2>&1 </dev/null
callgrind_annotate --inclusive=yes "$out/cg.out" 2>/dev/null | awk '
  function count(s) { gsub(",", "", s); return s + 0 }
  /PROGRAM TOTALS/ { total = count($1) }
  /kiln_exported::GraphProgram::run\(/ && !run { run = count($1) }
  /c10::Dispatcher::callBoxed/ && !boxed { boxed = count($1) }
  END { printf "3 steps: loop %d instructions; GraphProgram::run %d, its operators %d; the interpreter %d (%.3f %% of the loop)\n",
        total, run, boxed, run - boxed, 100 * (run - boxed) / total }'

# Peak RSS with and without activation checkpointing, where activations
# dominate: 32 x 128 tokens a step.
for side in without with; do
  extra=""; [ "$side" = with ] && extra='activation_checkpointing = ["model.layers.*"]'
  manifest "rss_$side" "$extra" 32
  sed -i 's/^max_epochs = 1$/max_epochs = 1\nmax_steps = 4/' "$out/rss_$side.toml"
  /usr/bin/time -f '%M' -o "$out/rss" "$build/bin/kiln" fit "$out/rss_$side.toml" >/dev/null 2>&1 </dev/null
  printf 'peak RSS %s activation checkpointing (batch 32 x 128): %d MiB\n' "$side" $(( $(cat "$out/rss") / 1024 ))
done
