#!/usr/bin/env python3
"""Writes the "sections" seeds of checkpoint_fuzz (corpus/checkpoint/sections-*.bin).

The input layout is checkpoint_fuzz.cpp's: a flags byte (bit 0: SGD rather
than Adam, bit 1: the model with a buffer), then sections, each a selector
byte (an index into kNames there), a little-endian u16 length and the data.
The model is the test recorder plugin's (weight [2,4], bias [2]). Run from
anywhere; it rewrites only its own files.
"""
import os
import random
import struct

NAMES = [
    "meta", "manifest", "param/weight", "param/bias",
    "buffer/running", "optim/0/step", "optim/0/exp_avg", "optim/0/exp_avg_sq",
    "optim/0/max_exp_avg_sq", "optim/0/sgd", "optim/0/momentum_buffer", "optim/1/step",
    "optim/1/exp_avg", "optim/1/exp_avg_sq", "optim/1/sgd", "optim/1/momentum_buffer",
    "rng/cpu", "plugin/p/state", "plugin/p/tensor", "metrics/latest",
    "metrics/pending", "metrics/csv",
]
rng = random.Random(0)


def tensor(dtype, shape, item, fmt=None):
    count = 1
    for n in shape:
        count *= n
    header = f"{dtype} {','.join(str(n) for n in shape)}\n".encode()
    if fmt:
        return header + struct.pack("<" + fmt * count, *[rng.uniform(-1, 1) for _ in range(count)])
    return header + bytes(rng.randrange(256) for _ in range(count * item))


def seed(flags, sections):
    out = bytearray([flags])
    for name, data in sections:
        out += bytes([NAMES.index(name)]) + struct.pack("<H", len(data)) + data
    return bytes(out)


META = b"format 1\nkiln 0.1.0\nepoch 2\nnext_batch 3\nglobal_step 11\nmonitor val/loss\nmonitored 0x1.8p-1\n"
COMMON = [
    ("meta", META),
    ("manifest", b"[run]\nname = 'x'\n"),
    ("param/weight", tensor("Float", [2, 4], 4, "f")),
    ("param/bias", tensor("Float", [2], 4, "f")),
]
# The CPU generator's state in LibTorch 1.13 is 5056 bytes.
TAIL = [
    ("rng/cpu", tensor("Byte", [5056], 1)),
    ("plugin/p/state", b"3"),
    ("plugin/p/tensor", tensor("Long", [3], 8)),
    ("metrics/latest", b"0x1.83b691p-1 train/loss\n0x1.662b578p-1 val/loss\n"),
    ("metrics/pending", b""),
    ("metrics/csv", b"epoch,step,train/loss\n0,4,0.75\n"),
]
ADAM = [
    ("optim/0/step", b"4"), ("optim/0/exp_avg", tensor("Float", [2, 4], 4, "f")),
    ("optim/0/exp_avg_sq", tensor("Float", [2, 4], 4, "f")),
    ("optim/1/step", b"4"), ("optim/1/exp_avg", tensor("Float", [2], 4, "f")),
    ("optim/1/exp_avg_sq", tensor("Float", [2], 4, "f")),
]
SGD = [
    ("optim/0/sgd", b""), ("optim/0/momentum_buffer", tensor("Float", [2, 4], 4, "f")),
    ("optim/1/sgd", b""), ("optim/1/momentum_buffer", tensor("Float", [2], 4, "f")),
]
SEEDS = {
    "adam": seed(0, COMMON + ADAM + TAIL),
    "sgd_buffer": seed(3, COMMON + [("buffer/running", tensor("Float", [2], 4, "f"))] + SGD + TAIL),
    # Near-valid: each one thing wrong.
    "bad_meta": seed(0, [("meta", META.replace(b"epoch 2", b"epoch two"))] + COMMON[1:] + ADAM + TAIL),
    "bad_shape": seed(0, COMMON[:2] + [("param/weight", tensor("Float", [4, 2], 4, "f"))] + COMMON[3:] + ADAM + TAIL),
    "bad_rng": seed(1, COMMON + SGD + [("rng/cpu", tensor("Byte", [16], 1))] + TAIL[1:]),
    "huge_dims": seed(0, COMMON[:2] + [("param/weight", b"Float 4294967296,4294967296\n")] + COMMON[3:] + TAIL),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "checkpoint")
for name, data in SEEDS.items():
    with open(os.path.join(here, f"sections-{name}.bin"), "wb") as f:
        f.write(data)
    print(f"sections-{name}.bin: {len(data)} bytes")
