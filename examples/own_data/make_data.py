"""Writes one small dataset in each format kiln reads without C++, from a fixed seed.

    python3 make_data.py [OUT_DIR]        # default: ./data

  OUT_DIR/arrays/{train,val,test}/{x,y}.npy   as np.save: float32 features, int64 labels
  OUT_DIR/arrays/{train,val,test}.safetensors as safetensors.numpy.save_file: "x" and "y"
  OUT_DIR/table/{train,val,test}.csv          the same rows as a table; the class as a name
  OUT_DIR/images/{train,test}/<class>/*.jpg|png  torchvision's ImageFolder layout

The rows are three Gaussian blobs in 8 dimensions (class names "amber",
"birch", "cedar"); the images are 32x32 circles, squares and triangles in
random colours, sizes and places on a noisy background, a third of them PNG.

Needs only Python 3.9+'s standard library: no NumPy, Pillow or safetensors
(a fresh Debian has none and its python3 refuses `pip install`). So this
file writes the .npy, .safetensors, PNG and baseline JPEG formats itself,
byte for byte as those libraries lay them out, and kiln reads them with its
own readers (libjpeg-turbo and libpng for the images).
"""
import csv
import json
import math
import random
import struct
import sys
import zlib
from operator import mul
from pathlib import Path

# --- .npy and .safetensors ------------------------------------------------------


def save_npy(path, descr, shape, data):
    """An .npy file (format 1.0), laid out as np.save lays it out.

    The header is a Python dict literal. np.save leaves room after it for
    the first axis to grow to 21 digits (so a file can be appended to in
    place) and pads with spaces to a multiple of 64 bytes, ending in a
    newline, so that the data that follows is aligned for memory mapping.
    """
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    header += " " * (21 - len(repr(shape[0])))
    magic = b"\x93NUMPY\x01\x00"
    pad = 64 - (len(magic) + 2 + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin1")
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<H", len(header)) + header + data)


def save_safetensors(path, tensors):
    """A .safetensors file, laid out as the safetensors library lays it out.

    `tensors` is [(name, dtype, shape, little-endian bytes)]. The file is an
    8-byte little-endian header length, a compact JSON header and the data.
    The library stores the tensors largest dtype first (then by name), so
    that each one starts aligned (here "y", I64, before "x", F32), lists
    them in the header in that order, and pads the header with spaces to a
    multiple of 8 bytes.
    """
    rank = {"F32": 0, "I64": 1}  # safetensors' Dtype order: F32 < I64
    tensors = sorted(tensors, key=lambda t: (-rank[t[1]], t[0]))
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors))


# --- PNG ------------------------------------------------------------------------


def png_bytes(pixels, width, height):
    """An 8-bit RGB PNG of `pixels` (bytes, row by row, RGB per pixel).

    Every row with filter 0 (none): the simplest valid PNG; zlib still
    compresses it, and the images are small.
    """

    def chunk(kind, data):
        # A chunk's CRC covers its type and data, not its length.
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    stride = width * 3
    raw = b"".join(b"\x00" + pixels[y * stride : (y + 1) * stride] for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, filter 0, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


# --- JPEG: a small baseline encoder ---------------------------------------------
#
# Baseline sequential DCT (SOF0), 8-bit, three components (YCbCr, JFIF) at
# full resolution each (4:4:4: no subsampling keeps the encoder simple and
# the small shapes' edges sharp), the example tables of the JPEG standard's
# Annex K for quantisation (scaled by quality as IJG's libjpeg scales them)
# and for Huffman coding: what Pillow's default save gives, less the
# subsampling.

# Annex K.1: luminance and chrominance quantisation tables, in natural
# (row by row) order.
LUMA_Q = [
    16, 11, 10, 16, 24, 40, 51, 61,
    12, 12, 14, 19, 26, 58, 60, 55,
    14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62,
    18, 22, 37, 56, 68, 109, 103, 77,
    24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101,
    72, 92, 95, 98, 112, 100, 103, 99,
]  # fmt: skip
CHROMA_Q = [
    17, 18, 24, 47, 99, 99, 99, 99,
    18, 21, 26, 66, 99, 99, 99, 99,
    24, 26, 56, 99, 99, 99, 99, 99,
    47, 66, 99, 99, 99, 99, 99, 99,
] + [99] * 32  # fmt: skip

# Annex K.3: the Huffman tables, as a DHT segment holds them: how many codes
# of each length 1..16, then the symbols in the order of their codes. A DC
# symbol is the size (in bits) of the difference from the previous block's
# DC; an AC symbol is (zeros before the coefficient) << 4 | its size, with
# 0x00 the end of block and 0xF0 a run of sixteen zeros.
DC_LUMA = ([0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0], list(range(12)))
DC_CHROMA = ([0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0], list(range(12)))
AC_LUMA = (
    [0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 0x7D],
    [
        0x01, 0x02, 0x03, 0x00, 0x04, 0x11, 0x05, 0x12, 0x21, 0x31, 0x41, 0x06, 0x13, 0x51, 0x61, 0x07,
        0x22, 0x71, 0x14, 0x32, 0x81, 0x91, 0xA1, 0x08, 0x23, 0x42, 0xB1, 0xC1, 0x15, 0x52, 0xD1, 0xF0,
        0x24, 0x33, 0x62, 0x72, 0x82, 0x09, 0x0A, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x25, 0x26, 0x27, 0x28,
        0x29, 0x2A, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3A, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49,
        0x4A, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5A, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69,
        0x6A, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7A, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89,
        0x8A, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7,
        0xA8, 0xA9, 0xAA, 0xB2, 0xB3, 0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA, 0xC2, 0xC3, 0xC4, 0xC5,
        0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xD9, 0xDA, 0xE1, 0xE2,
        0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8,
        0xF9, 0xFA,
    ],
)  # fmt: skip
AC_CHROMA = (
    [0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 0x77],
    [
        0x00, 0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0x07, 0x61, 0x71,
        0x13, 0x22, 0x32, 0x81, 0x08, 0x14, 0x42, 0x91, 0xA1, 0xB1, 0xC1, 0x09, 0x23, 0x33, 0x52, 0xF0,
        0x15, 0x62, 0x72, 0xD1, 0x0A, 0x16, 0x24, 0x34, 0xE1, 0x25, 0xF1, 0x17, 0x18, 0x19, 0x1A, 0x26,
        0x27, 0x28, 0x29, 0x2A, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3A, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48,
        0x49, 0x4A, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5A, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68,
        0x69, 0x6A, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7A, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87,
        0x88, 0x89, 0x8A, 0x92, 0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0xA2, 0xA3, 0xA4, 0xA5,
        0xA6, 0xA7, 0xA8, 0xA9, 0xAA, 0xB2, 0xB3, 0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA, 0xC2, 0xC3,
        0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xD9, 0xDA,
        0xE2, 0xE3, 0xE4, 0xE5, 0xE6, 0xE7, 0xE8, 0xE9, 0xEA, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8,
        0xF9, 0xFA,
    ],
)  # fmt: skip

# Zigzag order: the natural index of the k-th coefficient sent. It walks the
# anti-diagonals (row + column constant) from the DC term, alternately up
# and to the right (even diagonals) and down and to the left (odd ones), so
# that the high frequencies, mostly zero after quantisation, come last.
ZIGZAG = sorted(range(64), key=lambda i: (i // 8 + i % 8, i // 8 if (i // 8 + i % 8) % 2 else -(i // 8)))

# The 8-point DCT-II as a matrix: COS[u][x] = C(u)/2 cos((2x+1)u pi/16), with
# C(0) = 1/sqrt(2), else 1. The 2-D DCT of a block is COS . block . COS^T,
# which is the standard's F(v,u) = 1/4 C(u)C(v) sum f(y,x) cos.. cos.. .
COS = [
    [(math.sqrt(0.5) if u == 0 else 1.0) / 2 * math.cos((2 * x + 1) * u * math.pi / 16) for x in range(8)]
    for u in range(8)
]


def scaled_table(base, quality):
    """`base` scaled by `quality` (1..100) as IJG's libjpeg (and so Pillow) does."""
    scale = 5000 // quality if quality < 50 else 200 - 2 * quality
    return [min(max((q * scale + 50) // 100, 1), 255) for q in base]


def huffman_codes(table):
    """{symbol: (code, length)} from a table's code counts (JPEG Annex C).

    Codes of one length are consecutive integers; moving to the next length
    appends a 0 bit (doubles the next code).
    """
    counts, symbols = table
    codes, code, k = {}, 0, 0
    for length, count in enumerate(counts, start=1):
        for _ in range(count):
            codes[symbols[k]] = (code, length)
            code += 1
            k += 1
        code <<= 1
    return codes


class BitWriter:
    """Huffman codes and value bits, most significant bit first."""

    def __init__(self):
        # One Python int holds the whole scan: the images are small (a few
        # kB), and appending to an int is much faster than bit by bit.
        self.bits = 0
        self.count = 0

    def put(self, value, length):
        self.bits = (self.bits << length) | value
        self.count += length

    def scan_bytes(self):
        # The last byte is filled with 1 bits (the standard's padding), and
        # each 0xFF in the data is followed by a 0x00 so that a decoder does
        # not take it for the start of a marker ("byte stuffing").
        pad = -self.count % 8
        bits = (self.bits << pad) | ((1 << pad) - 1)
        return bits.to_bytes((self.count + pad) // 8, "big").replace(b"\xff", b"\xff\x00")


def put_value(out, value):
    """A DC difference or AC coefficient's size (what is Huffman coded) and
    then its bits: `size` bits of the value if positive, of value - 1 (its
    one's complement) if negative, so that the first bit gives the sign."""
    size = abs(value).bit_length()
    out.put(value if value >= 0 else value + (1 << size) - 1, size)
    return size


def encode_block(out, block, q, previous_dc, dc_codes, ac_codes):
    """Transforms, quantises and Huffman-codes one 8x8 block (64 level-
    shifted samples, row by row); returns its quantised DC coefficient,
    which the next block of the same component codes as a difference."""
    # Separable 2-D DCT: each row's 1-D DCT, then each column's of those.
    rows = [[sum(map(mul, basis, block[y * 8 : y * 8 + 8])) for basis in COS] for y in range(8)]
    columns = list(zip(*rows))  # columns[u][y]
    coefficients = [sum(map(mul, COS[i // 8], columns[i % 8])) for i in range(64)]  # natural order (v, u)
    zz = [round(coefficients[i] / q[i]) for i in ZIGZAG]

    dc = zz[0]
    size = abs(dc - previous_dc).bit_length()
    out.put(*dc_codes[size])
    put_value(out, dc - previous_dc)
    run = 0
    for value in zz[1:]:
        if value == 0:
            run += 1
            continue
        while run > 15:  # a run of more than 15 zeros is sent sixteen at a time
            out.put(*ac_codes[0xF0])
            run -= 16
        size = abs(value).bit_length()
        out.put(*ac_codes[(run << 4) | size])
        put_value(out, value)
        run = 0
    if run:  # the zeros up to the end of the block: one end-of-block code
        out.put(*ac_codes[0x00])
    return dc


def segment(marker, payload):
    """A marker segment: 0xFF, the marker, a length that counts itself."""
    return bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload


def jpeg_bytes(pixels, width, height, quality=92):
    """A baseline JFIF JPEG of `pixels` (bytes, row by row, RGB per pixel);
    `width` and `height` multiples of 8 (the images here are 32x32)."""
    assert width % 8 == 0 and height % 8 == 0
    luma_q, chroma_q = scaled_table(LUMA_Q, quality), scaled_table(CHROMA_Q, quality)
    dc_luma, ac_luma = huffman_codes(DC_LUMA), huffman_codes(AC_LUMA)
    dc_chroma, ac_chroma = huffman_codes(DC_CHROMA), huffman_codes(AC_CHROMA)

    # JFIF's RGB -> YCbCr (full range), less 128: the DCT wants samples
    # centred on 0, and Cb and Cr are already centred on 128.
    planes = ([], [], [])
    for i in range(0, width * height * 3, 3):
        r, g, b = pixels[i], pixels[i + 1], pixels[i + 2]
        planes[0].append(0.299 * r + 0.587 * g + 0.114 * b - 128)
        planes[1].append(-0.168736 * r - 0.331264 * g + 0.5 * b)
        planes[2].append(0.5 * r - 0.418688 * g - 0.081312 * b)

    # Without subsampling one MCU is one 8x8 block of Y, then of Cb, of Cr,
    # and the MCUs run left to right, top to bottom.
    components = ((planes[0], luma_q, dc_luma, ac_luma), (planes[1], chroma_q, dc_chroma, ac_chroma),
                  (planes[2], chroma_q, dc_chroma, ac_chroma))  # fmt: skip
    out = BitWriter()
    previous = [0, 0, 0]
    for by in range(0, height, 8):
        for bx in range(0, width, 8):
            for c, (plane, q, dc_codes, ac_codes) in enumerate(components):
                block = [v for y in range(by, by + 8) for v in plane[y * width + bx : y * width + bx + 8]]
                previous[c] = encode_block(out, block, q, previous[c], dc_codes, ac_codes)

    def dht(table_class, table_id, table):
        counts, symbols = table
        return bytes([table_class << 4 | table_id] + counts + symbols)

    return b"".join([
        b"\xff\xd8",  # SOI
        # APP0 JFIF 1.01: no units, 1:1 pixels, no thumbnail. It says the
        # components are YCbCr, which decoders assume for three anyway.
        segment(0xE0, b"JFIF\x00\x01\x01\x00" + struct.pack(">HH", 1, 1) + b"\x00\x00"),
        # DQT: table 0 (luma) and 1 (chroma), 8-bit, in zigzag order.
        segment(0xDB, bytes([0] + [luma_q[i] for i in ZIGZAG] + [1] + [chroma_q[i] for i in ZIGZAG])),
        # SOF0: 8-bit samples, height, width, three components: (id, 1x1
        # sampling, quantisation table), Y with table 0, Cb and Cr with 1.
        segment(0xC0, struct.pack(">BHHB", 8, height, width, 3) + bytes([1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1])),
        # DHT: DC (class 0) and AC (class 1) tables 0 (luma) and 1 (chroma).
        segment(0xC4, dht(0, 0, DC_LUMA) + dht(1, 0, AC_LUMA) + dht(0, 1, DC_CHROMA) + dht(1, 1, AC_CHROMA)),
        # SOS: the three components (id, DC table << 4 | AC table), all 64
        # coefficients (0..63), no successive approximation.
        segment(0xDA, bytes([3, 1, 0x00, 2, 0x11, 3, 0x11, 0, 63, 0])),
        out.scan_bytes(),
        b"\xff\xd9",  # EOI
    ])  # fmt: skip


# --- the data -------------------------------------------------------------------

CLASSES = ["amber", "birch", "cedar"]
SHAPES = ["circle", "square", "triangle"]
SIZE = 32


def rows(rng, centres, n):
    """n rows: a class drawn uniformly, its centre plus unit Gaussian noise.
    Returns the features as float32 bytes, their float32 values (for the
    CSV, so that it holds the very numbers the arrays do) and the labels."""
    y = [rng.randrange(3) for _ in range(n)]
    x = [c + rng.gauss(0.0, 1.0) for label in y for c in centres[label]]
    x32 = struct.pack("<%df" % len(x), *x)  # rounds each to the nearest float32, as astype does
    return x32, struct.unpack("<%df" % len(x), x32), y


def image(rng, shape):
    """A 32x32 RGB image (bytes, row by row) of one filled `shape` in a
    random light colour, size and place, on dark Gaussian noise."""
    background = [rng.randrange(90) for _ in range(3)]
    pixels = bytearray(
        int(min(255.0, max(0.0, background[i % 3] + rng.gauss(0.0, 18.0)))) for i in range(SIZE * SIZE * 3)
    )
    r = rng.randint(7, 12)
    cx, cy = rng.randint(r, SIZE - 1 - r), rng.randint(r, SIZE - 1 - r)
    colour = bytes(rng.randint(120, 255) for _ in range(3))
    # Which pixel centres each shape covers: a disc of radius r (+ half a
    # pixel, as a drawn circle's edge pixels count), the square of side
    # 2r + 1, and the triangle with its apex at (cx, cy - r) and its base
    # from (cx - r, cy + r) to (cx + r, cy + r).
    for y in range(cy - r, cy + r + 1):
        for x in range(cx - r, cx + r + 1):
            if shape == "circle":
                inside = (x - cx) ** 2 + (y - cy) ** 2 <= (r + 0.5) ** 2
            elif shape == "square":
                inside = True
            else:
                inside = 2 * abs(x - cx) <= y - (cy - r) + 1
            if inside:
                at = (y * SIZE + x) * 3
                pixels[at : at + 3] = colour
    return bytes(pixels)


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "data")
    rng = random.Random(2026)

    # Rows: arrays, safetensors, CSV.
    centres = [[rng.gauss(0.0, 1.6) for _ in range(8)] for _ in range(3)]
    (out / "table").mkdir(parents=True, exist_ok=True)
    for name, n in (("train", 1500), ("val", 300), ("test", 300)):
        x32, x, y = rows(rng, centres, n)
        y64 = struct.pack("<%dq" % n, *y)
        # A .npy's key is its file's stem: one folder per split, the same names.
        (out / "arrays" / name).mkdir(parents=True, exist_ok=True)
        save_npy(out / "arrays" / name / "x.npy", "<f4", (n, 8), x32)
        save_npy(out / "arrays" / name / "y.npy", "<i8", (n,), y64)
        save_safetensors(out / "arrays" / f"{name}.safetensors", [("x", "F32", (n, 8), x32), ("y", "I64", (n,), y64)])
        with open(out / "table" / f"{name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([f"f{i}" for i in range(8)] + ["species"])
            for i, label in enumerate(y):
                w.writerow([f"{v:.6f}" for v in x[i * 8 : i * 8 + 8]] + [CLASSES[label]])

    # Images: an ImageFolder.
    for split, per_class in (("train", 150), ("test", 40)):
        for shape in SHAPES:
            folder = out / "images" / split / shape
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = image(rng, shape)
                if i % 3 == 2:
                    (folder / f"{shape}_{i:03d}.png").write_bytes(png_bytes(pixels, SIZE, SIZE))
                else:
                    (folder / f"{shape}_{i:03d}.jpg").write_bytes(jpeg_bytes(pixels, SIZE, SIZE, quality=92))
    print(f"make_data.py: arrays, table and images in {out}")


if __name__ == "__main__":
    main()
