#!/usr/bin/env bash
# distributed.shard = optimizer (ZeRO-1) against the replicated path, in one
# run, on Fashion-MNIST with a wide MLP (784-2048-2048-10: 5.8 M values;
# Adam's moments 46 MB replicated), 1 thread a rank, 3 epochs of 60 batches of 128:
# the peak RSS of the largest process (GNU time's maximum resident set of
# the launcher and the ranks it waits for), the median epoch time, and what
# the run says each rank owns.
#   bench/shard.sh [PROCESSES...]      (default: 2 4)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${KILN_BUILD_DIR:-build}
cmake --build "$build" -j2 --target kiln kiln_mlp kiln_fashion_mnist >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
procs=("$@")
[ ${#procs[@]} -gt 0 ] || procs=(2 4)
printf "%-10s %-9s %14s %16s\n" processes shard "peak RSS (MB)" "epoch (s, median)"
for n in "${procs[@]}"; do
  for mode in none optimizer; do
    log="$out/$n-$mode.log"
    /usr/bin/time -v -o "$out/time" "$build/bin/kiln" fit bench/mlp256.toml -n "$n" --set checkpoint.every_n_epochs="${KILN_SHARD_CHECKPOINTS:-1}" \
      --set model.hidden=[2048,2048] --set trainer.max_epochs=3 --set trainer.limit_train_batches=60 --set trainer.test_after_fit=false \
      --set distributed.shard="$mode" --set run.dir="$out/run-$n-$mode" --set trainer.progress=none >"$log" 2>&1
    rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 / 1024}' "$out/time")
    epoch=$(grep -o 'epoch [0-9]*/[0-9]* .*(\([0-9.]*\) s' "$log" | sed 's/.*(\([0-9.]*\) s/\1/' | sort -n |
      awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
    printf "%-10s %-9s %14s %16s\n" "$n" "$mode" "$rss" "$epoch"
    grep -o 'rank 0 holds .*' "$log" | head -1 | sed 's/^/           /' || true
  done
done
