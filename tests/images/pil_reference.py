"""Images written by PIL, and what PIL and torchvision make of them.

    pil_reference.py OUT_DIR

kiln_image_folder's decoders and transforms are checked against these
(tests/unit/image_test.cpp). For every image NAME.EXT in OUT_DIR:
  NAME.EXT.MODE.npy          np.asarray(Image.open(NAME.EXT).convert(MODE)), MODE in L, RGB, RGBA
and for the transform cases listed in OUT_DIR/transforms.txt (one per line,
"IMAGE MODE OP ARGS... -> FILE.npy"), the uint8 HWC result of that
torchvision.transforms.functional call on the PIL image. Damaged files
(truncated, not an image) are written too, for the refusals.
"""
import sys
from pathlib import Path

import numpy as np
from PIL import Image

try:
    import torchvision.transforms.functional as F
except ImportError:  # the decoders are still checked, the transforms skip
    F = None

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(20261126)


def smooth(h, w, c):
    """A photo-like image (gradients plus noise): JPEG's IDCT differences
    stay small on it, as on real photos."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 127 // max(h + w - 2, 1))], -1)
    noise = rng.integers(-20, 21, size=(h, w, 3))
    img = np.clip(base + noise, 0, 255).astype(np.uint8)
    return img[..., :c] if c < 3 else img


images = {}
rgb = smooth(29, 37, 3)
images["rgb.png"] = Image.fromarray(rgb, "RGB")
images["gray.png"] = Image.fromarray(rgb[..., 0], "L")
rgba = np.concatenate([rgb, rng.integers(0, 256, size=(29, 37, 1), dtype=np.uint8)], -1)
images["rgba.png"] = Image.fromarray(rgba, "RGBA")
images["la.png"] = Image.fromarray(rgba[..., [0, 3]], "LA")
palette = Image.fromarray(rgb, "RGB").quantize(colors=16)
palette.info["transparency"] = 3
images["palette.png"] = palette
images["bilevel.png"] = Image.fromarray(rgb[..., 1] > 128).convert("1")
images["tall.png"] = Image.fromarray(smooth(61, 23, 3), "RGB")
for name, img in images.items():
    img.save(out / name)
Image.fromarray(rgb, "RGB").save(out / "rgb.jpg", quality=90)
Image.fromarray(rgb, "RGB").save(out / "rgb444.jpg", quality=95, subsampling=0)
Image.fromarray(rgb, "RGB").save(out / "progressive.jpg", quality=85, progressive=True)
Image.fromarray(rgb[..., 0], "L").save(out / "gray.jpg", quality=90)
Image.fromarray(smooth(375, 500, 3), "RGB").save(out / "photo.jpg", quality=90)

readable = sorted(p.name for p in out.iterdir() if p.suffix in (".png", ".jpg"))
for name in readable:
    with Image.open(out / name) as img:
        for mode in ("L", "RGB", "RGBA"):
            np.save(out / f"{name}.{mode}.npy", np.asarray(img.convert(mode)))

# Damaged copies: kiln refuses each with one line naming the file.
(out / "truncated.png").write_bytes((out / "rgb.png").read_bytes()[:200])
(out / "truncated.jpg").write_bytes((out / "photo.jpg").read_bytes()[:3000])
(out / "text.jpg").write_bytes(b"this is not an image\n")
(out / "empty.png").write_bytes(b"")

cases = []
if F is not None:
    def case(image, mode, op, args, result):
        fname = f"t{len(cases)}.npy"
        np.save(out / fname, np.asarray(result))
        cases.append(f"{image} {mode} {op} {' '.join(str(a) for a in args)} -> {fname}")

    for image in ("rgb.png", "tall.png", "photo.jpg", "gray.png", "rgba.png"):
        for mode in ("RGB", "L", "RGBA"):
            with Image.open(out / image) as opened:
                img = opened.convert(mode)
            for size in ([17, 13], [50, 41], [20], [9], [224]):
                case(image, mode, "resize", size, F.resize(img, size, antialias=True))
            for size in ([10, 12], [40, 40], [29, 8], [5, 60]):
                case(image, mode, "center_crop", size, F.center_crop(img, size))
            case(image, mode, "hflip", [], F.hflip(img))
            # RandomResizedCrop's crop then resize, at a fixed box.
            case(image, mode, "resized_crop", [3, 4, 15, 20, 11, 11], F.resized_crop(img, 3, 4, 15, 20, [11, 11], antialias=True))
(out / "transforms.txt").write_text("".join(c + "\n" for c in cases))
print(f"{len(readable)} images, {len(cases)} transform cases in {out}")
