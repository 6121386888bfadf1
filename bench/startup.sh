#!/usr/bin/env bash
# Start-up: what a user waits for on every run, as medians over rounds.
#
#   bench/startup.sh [rounds]          (default 5)
#   KILN_BASELINE=/path/to/other/kiln bench/startup.sh 5   # also time another build, alternating
#
# Cases (all on the reference mlp256, bench/mlp256.toml, one intra-op thread):
#   version   `kiln --version`: loading LibTorch and its libraries, nothing else
#   inspect   `kiln inspect bench/mlp256.toml`
#   fit       `kiln fit` of one training step (1 epoch of 1 batch, no test)
#   resume    the same, resumed with `--resume last` from a checkpoint directory
#             holding 5 checkpoints of a wider model (hidden [2048, 2048],
#             5.8 M parameters: ~70 MB each), compared with a fresh start of
#             that model in an empty directory (fresh-wide)
#   fit-n2    the one-step fit with `-n 2`: the supervisor, then two workers
#             that each load LibTorch again and meet (times of rank 0)
#   epochs100 not start-up but its per-epoch cousin: 100 epochs of one batch
#             each (the sampler used to replay every earlier epoch's shuffle
#             to plan the next: ~5000 randperm(60000) in all; now 100)
# For each: the wall time of the whole command, and for kiln fit the
# "start-up:" debug lines' seconds since the process started (main reached,
# plugins set up, first training step). A baseline without those lines shows
# only wall times. Run it on an otherwise idle machine; timings are not tests.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_fashion_mnist >/dev/null
bins=("$build/bin/kiln")
[ -n "${KILN_BASELINE:-}" ] && bins+=("$KILN_BASELINE")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

one_step=(--set run.threads=1 --set trainer.max_epochs=1 --set trainer.limit_train_batches=1
          --set trainer.test_after_fit=false --set run.log_level=debug)
wide=(--set 'model.hidden=[2048,2048]' --set checkpoint.enabled=true --set checkpoint.save_top_k=-1)

# The checkpoint directory the resume case starts from (built once, by the
# first kiln: the format is the same for both).
"${bins[0]}" fit bench/mlp256.toml "${wide[@]}" --set run.threads=1 --set trainer.limit_train_batches=2 \
  --set trainer.max_epochs=5 --set trainer.test_after_fit=false --set run.dir="$work/prepared" >"$work/prep.log" 2>&1 ||
  { tail -5 "$work/prep.log" >&2; exit 1; }
ckpt_mb=$(du -sm "$work/prepared/checkpoints" | cut -f1)

results="$work/results"
: >"$results"
# record <binary index> <case> <log> <wall seconds>
record() {
  local b=$1 case=$2 log=$3 wall=$4
  echo "$b $case wall $wall" >>"$results"
  # With -n 2 every process logs: rank 0's lines only (the supervisor's own
  # "main() reached" is not rank 0's).
  if [ "$case" = fit-n2 ]; then grep -F '[rank 0]' "$log" >"$log.0" || true; log=$log.0; fi
  awk -v b="$b" -v c="$case" '
    /start-up: main\(\) reached at/ { for (i = 1; i <= NF; i++) if ($i == "at") { print b, c, "main", $(i + 1); break } }
    /start-up: plugins set up/      { for (i = 1; i <= NF; i++) if ($i == "at") { print b, c, "setup", $(i + 1); break } }
    /start-up: first training step/ { for (i = 1; i <= NF; i++) if ($i == "at") { print b, c, "first_step", $(i + 1); break } }
  ' "$log" >>"$results"
}
# timed <binary index> <case> <command...>
timed() {
  local b=$1 case=$2
  shift 2
  local log="$work/log" t0 t1
  t0=$(date +%s.%N)
  "$@" >"$log" 2>&1 </dev/null || { echo "$case failed:" >&2; tail -5 "$log" >&2; exit 1; }
  t1=$(date +%s.%N)
  record "$b" "$case" "$log" "$(echo "$t1 - $t0" | bc -l)"
}

for r in $(seq 1 "$rounds"); do
  for b in "${!bins[@]}"; do
    # The side that goes first alternates round by round.
    [ ${#bins[@]} -gt 1 ] && [ $((r % 2)) = 0 ] && b=$((${#bins[@]} - 1 - b))
    k=${bins[$b]}
    timed "$b" version "$k" --version
    timed "$b" inspect "$k" inspect bench/mlp256.toml
    rm -rf "$work/fit"
    timed "$b" fit "$k" fit bench/mlp256.toml "${one_step[@]}" --set run.dir="$work/fit"
    rm -rf "$work/fit2"
    timed "$b" fit-n2 "$k" fit bench/mlp256.toml -n 2 "${one_step[@]}" --set run.dir="$work/fit2"
    rm -rf "$work/fresh"
    timed "$b" fresh-wide "$k" fit bench/mlp256.toml "${one_step[@]}" "${wide[@]}" --set checkpoint.every_n_epochs=0 \
      --set run.dir="$work/fresh"
    # Hard links: the resumed run may write (metrics.csv is replaced by
    # rename), never through into the prepared files. No checkpoint is
    # committed (every_n_epochs = 0); the directory is still listed.
    rm -rf "$work/resumed"
    cp -al "$work/prepared" "$work/resumed"
    timed "$b" resume "$k" fit bench/mlp256.toml "${one_step[@]}" "${wide[@]}" --set checkpoint.every_n_epochs=0 \
      --set trainer.max_epochs=6 --set run.dir="$work/resumed" --resume last
    rm -rf "$work/epochs"
    timed "$b" epochs100 "$k" fit bench/mlp256.toml "${one_step[@]}" --set trainer.max_epochs=100 \
      --set run.dir="$work/epochs"
  done
done

echo "start-up, medians of $rounds rounds ($(date -u +%Y-%m-%d), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) at the end);"
echo "resume: $ckpt_mb MB of checkpoints in the directory (5 x ~70 MB + last.ckpt, a hard link)"
for b in "${!bins[@]}"; do
  echo
  echo "${bins[$b]}:"
  echo "| case | wall s | main() reached s | plugins set up s | first training step s |"
  echo "|---|---|---|---|---|"
  for case in version inspect fit fit-n2 fresh-wide resume epochs100; do
    row="| $case |"
    for what in wall main setup first_step; do
      v=$(awk -v b="$b" -v c="$case" -v w="$what" '$1 == b && $2 == c && $3 == w { print $4 }' "$results" |
        sort -g | awk '{a[NR] = $1} END { if (NR) printf "%.2f", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2); else printf "—" }')
      row="$row $v |"
    done
    echo "$row"
  done
done
