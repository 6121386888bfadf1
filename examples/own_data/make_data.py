"""Writes one small dataset in each format kiln reads without C++, from a fixed seed.

    python3 make_data.py [OUT_DIR]        # default: ./data

  OUT_DIR/arrays/{train,val,test}/{x,y}.npy   np.save: float32 features, int64 labels
  OUT_DIR/arrays/{train,val,test}.safetensors the same arrays as tensors "x" and "y"
  OUT_DIR/table/{train,val,test}.csv          the same rows as a table; the class as a name
  OUT_DIR/images/{train,test}/<class>/*.jpg|png  torchvision's ImageFolder layout

The rows are three Gaussian blobs in 8 dimensions (class names "amber",
"birch", "cedar"); the images are 32x32 circles, squares and triangles in
random colours, sizes and places on a noisy background, a third of them PNG.
Needs numpy and Pillow; safetensors for the .safetensors files.
"""
import csv
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

out = Path(sys.argv[1] if len(sys.argv) > 1 else "data")
rng = np.random.default_rng(2026)

# --- rows: arrays, safetensors, CSV --------------------------------------------
classes = ["amber", "birch", "cedar"]
centres = rng.normal(0.0, 1.6, size=(3, 8))


def rows(n):
    y = rng.integers(0, 3, size=n)
    x = centres[y] + rng.normal(0.0, 1.0, size=(n, 8))
    return x.astype(np.float32), y.astype(np.int64)


splits = {"train": rows(1500), "val": rows(300), "test": rows(300)}
(out / "table").mkdir(parents=True, exist_ok=True)
for name, (x, y) in splits.items():
    # A .npy's key is its file's stem: one folder per split, the same names.
    (out / "arrays" / name).mkdir(parents=True, exist_ok=True)
    np.save(out / "arrays" / name / "x.npy", x)
    np.save(out / "arrays" / name / "y.npy", y)
    with open(out / "table" / f"{name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"f{i}" for i in range(8)] + ["species"])
        for xi, yi in zip(x, y):
            w.writerow([f"{v:.6f}" for v in xi] + [classes[yi]])
try:
    from safetensors.numpy import save_file

    for name, (x, y) in splits.items():
        save_file({"x": x, "y": y}, str(out / "arrays" / f"{name}.safetensors"))
except ImportError:
    print("make_data.py: no safetensors package; the .safetensors files are not written")

# --- images: an ImageFolder ------------------------------------------------------
shapes = ["circle", "square", "triangle"]


def image(shape):
    background = rng.integers(0, 90, size=3)
    pixels = np.clip(background + rng.normal(0, 18, size=(32, 32, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(img)
    r = int(rng.integers(7, 13))
    cx, cy = (int(v) for v in rng.integers(r, 32 - r, size=2))
    colour = tuple(int(v) for v in rng.integers(120, 256, size=3))
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    return img


for split, per_class in (("train", 150), ("test", 40)):
    for shape in shapes:
        folder = out / "images" / split / shape
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = image(shape)
            if i % 3 == 2:
                img.save(folder / f"{shape}_{i:03d}.png")
            else:
                img.save(folder / f"{shape}_{i:03d}.jpg", quality=92)
print(f"make_data.py: arrays, table and images in {out}")
