#!/usr/bin/env bash
# The memory a large memory-mapped array costs kiln_arrays (issue 22): a
# 4 GiB float32 .npy (1048576 rows x 1024) and its int64 labels, written by
# NumPy in chunks, then one epoch over every row (kiln_mlp 1024-64-10,
# batch 256, shuffled) under /usr/bin/time: the peak resident set of the
# kiln process against the file's size.
#
#   bench/arrays_rss.sh [ROWS]       (default 1048576: 4 GiB)
#
# Writes build/bench-arrays/big/ (4 GiB; delete it after).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-1048576}
build=${KILN_BUILD_DIR:-build}
py=${KILN_CHECK_PYTHON:-.venv-check/bin/python}
dir=$(realpath -m "$build/bench-arrays/big")
mkdir -p "$dir"
if [ ! -e "$dir/y.npy" ] || [ "$(cat "$dir/rows" 2>/dev/null)" != "$rows" ]; then
  "$py" - "$dir" "$rows" <<'PY'
import sys, numpy as np
out, rows = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
centroids = rng.normal(size=(10, 1024)).astype(np.float32)
x = np.lib.format.open_memmap(f"{out}/x.npy", mode="w+", dtype=np.float32, shape=(rows, 1024))
y = np.empty(rows, np.int64)
for at in range(0, rows, 65536):
    n = min(65536, rows - at)
    labels = rng.integers(0, 10, n)
    x[at:at + n] = centroids[labels] + rng.standard_normal((n, 1024), dtype=np.float32)
    y[at:at + n] = labels
x.flush(); del x
np.save(f"{out}/y.npy", y)
PY
  echo "$rows" >"$dir/rows"
fi
cat >"$dir/run.toml" <<TOML
[run]
name = "arrays-rss"
dir = "$dir/run"
seed = 0
threads = 2

[model]
path = "kiln_mlp"
in_features = 1024
hidden = [64]
classes = 10

[data]
path = "kiln_arrays"
train = ["$dir/x.npy", "$dir/y.npy"]
input = "x"
target = "y"

[trainer]
max_epochs = 1
batch_size = 256
progress = "none"

[optimizer]
name = "adam"
lr = 1e-3
TOML
rm -rf "$dir/run"
size=$(du -m "$dir/x.npy" | cut -f1)
# The resident set in two parts, sampled every 0.2 s: RssAnon (kiln's own
# memory) and RssFile (pages of the mapped files: page cache the kernel can
# reclaim, counted in RSS while mapped).
/usr/bin/time -f "%M %e" -o "$dir/time.txt" "$build/bin/kiln" fit "$dir/run.toml" >"$dir/fit.log" 2>&1 &
pid=$!
anon=0 file=0
while kill -0 "$pid" 2>/dev/null; do
  for child in $(pgrep -P "$pid") "$pid"; do
    read -r a f < <(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} END{print a+0, f+0}' "/proc/$child/status" 2>/dev/null || echo "0 0")
    [ "${a:-0}" -gt "$anon" ] && anon=$a
    [ "${f:-0}" -gt "$file" ] && file=$f
  done
  sleep 0.2
done
wait "$pid" || true
read -r rss_kib seconds <"$dir/time.txt"
echo "x.npy: $size MiB ($rows rows x 1024 float32); one shuffled epoch in $seconds s"
echo "peak RSS of kiln: $(( rss_kib / 1024 )) MiB: RssAnon (its own memory) $(( anon / 1024 )) MiB, RssFile (mapped files: LibTorch's libraries, and data read through a mapping) $(( file / 1024 )) MiB"
tail -3 "$dir/fit.log"
