#!/usr/bin/env bash
# kiln_image_folder against torchvision's ImageFolder + DataLoader (issue
# 22): images per second of one training epoch over a folder of JPEGs, with
# the same transforms (RandomResizedCrop(224), RandomHorizontalFlip,
# ToTensor + Normalize), batch 64, shuffled, and the same number of workers
# N (kiln: trainer.data_workers = N threads; torchvision: num_workers = N
# processes). kiln's model is kiln.bench.null_model (a step that costs
# nothing), torchvision's loop only takes the batches: both time the data
# path alone, from the epoch's start (workers started) to its last batch.
#
#   bench/image_folder.sh [ROUNDS] [IMAGES]     (default 3 rounds, 5000 images)
#
# The folder is made once by a script from a fixed seed (IMAGES JPEGs of
# about 500x375 in 10 classes; no download) under build/bench-images/. Needs
# a build (./go build; the null model is build/bench/libkiln_bench_null_model.so)
# and .venv-check's Python with torchvision (./go test installs Debian's).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} images=${2:-5000}
build=${KILN_BUILD_DIR:-build}
py=${KILN_CHECK_PYTHON:-.venv-check/bin/python}
kiln="$build/bin/kiln"
null_model=$(realpath "$build/bench/libkiln_bench_null_model.so")
out=$(realpath -m "$build/bench-images")
root=$out/jpeg-$images
[ -x "$kiln" ] && [ -e "$null_model" ] || { echo "image_folder.sh: build kiln and kiln_bench_null_model first" >&2; exit 2; }
"$py" -c "import torchvision" 2>/dev/null || { echo "image_folder.sh: $py has no torchvision" >&2; exit 2; }

if [ ! -e "$root/.complete" ]; then
  rm -rf "$root"
  "$py" - "$root" "$images" <<'PY'
import sys, numpy as np
from pathlib import Path
from PIL import Image, ImageDraw
root, n = Path(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(22)
for i in range(n):
    c = i % 10
    w, h = 500 + int(rng.integers(-20, 21)), 375 + int(rng.integers(-15, 16))
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (c + 1) * 7) % 256, (y * 3 + c * 25) % 256, ((x + y) // 3) % 256], -1)
    img = Image.fromarray(np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(img)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, w - 60)), int(rng.integers(0, h - 60))
        d.ellipse([x0, y0, x0 + int(rng.integers(20, 120)), y0 + int(rng.integers(20, 120))],
                  fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    folder = root / f"class_{c}"
    folder.mkdir(parents=True, exist_ok=True)
    img.save(folder / f"{i:05d}.jpg", quality=90)
(root / ".complete").write_text("")
PY
fi
count=$(find "$root" -name '*.jpg' | wc -l)
echo "== $count JPEGs in $root ($(du -sh "$root" | cut -f1)); $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "   kiln $(git rev-parse --short HEAD 2>/dev/null), torchvision $("$py" -c 'import torchvision, PIL; print(torchvision.__version__, "/ Pillow", PIL.__version__)')"

torchvision_epoch() {  # N -> images per second
  "$py" - "$root" "$1" <<'PY'
import sys, time, torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms as T
root, workers = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
data = datasets.ImageFolder(root, tf)
loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=workers)
start = time.perf_counter()
seen = 0
for x, y in loader:
    seen += x.shape[0]
print(f"{seen / (time.perf_counter() - start):.1f}")
PY
}

kiln_epoch() {  # N -> images per second
  local dir
  dir=$(mktemp -d)
  cat >"$dir/run.toml" <<EOF
[run]
dir = "$dir/run"
seed = 0
threads = 1

[model]
path = "$null_model"

[data]
path = "kiln_image_folder"
train = "$root"
transforms = [
  { name = "random_resized_crop", size = 224 },
  { name = "horizontal_flip" },
  { name = "normalize", mean = [0.485, 0.456, 0.406], std = [0.229, 0.224, 0.225] },
]
eval_transforms = [{ name = "center_crop", size = 224 }]

[trainer]
max_epochs = 1
batch_size = 64
data_workers = $1
progress = "none"
EOF
  "$kiln" fit "$dir/run.toml" >"$dir/log" 2>&1 || { cat "$dir/log" >&2; exit 1; }
  awk -F, -v n="$count" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "epoch_seconds") c = i }
                         NR > 1 && c && $c != "" { s = $c } END { printf "%.1f\n", n / s }' "$dir/run/metrics.csv"
  rm -rf "$dir"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for workers in 1 2; do
  k=() t=()
  for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then k+=("$(kiln_epoch "$workers")"); t+=("$(torchvision_epoch "$workers")")
    else t+=("$(torchvision_epoch "$workers")"); k+=("$(kiln_epoch "$workers")"); fi
  done
  km=$(printf '%s\n' "${k[@]}" | median) tm=$(printf '%s\n' "${t[@]}" | median)
  echo "N=$workers: kiln ${k[*]} images/s (median $km); torchvision ${t[*]} (median $tm); kiln/torchvision = $(awk -v a="$km" -v b="$tm" 'BEGIN {printf "%.3f", a / b}')"
done
