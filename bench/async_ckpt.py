"""The Python side of bench/async_ckpt.sh: times torch.save of a state as
large as kiln's (Lightning's path: model weights and Adam's two moments in
one dict, written on the training thread) and an in-memory copy of the same
bytes, then draws bench/async_ckpt.png from bench/async_ckpt.csv.

    python3 bench/async_ckpt.py WORKDIR SIZE_MB...

Debian's python3-torch (1.13, as kiln's LibTorch) and python3-matplotlib.
"""
import csv
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
work = sys.argv[1]
sizes = [int(s) for s in sys.argv[2:]] or [100, 250, 500, 1000, 2000]
here = os.path.dirname(os.path.abspath(__file__))
rows = list(csv.DictReader(open(os.path.join(here, "async_ckpt.csv"))))


def snapshot_mb(mode, mb):
    for r in rows:
        if r["mode"] == mode and int(r["target_mb"]) == mb:
            return float(r["snapshot_mb"])
    return mb


def state_of(total_bytes):
    """Weights, exp_avg and exp_avg_sq: three equal parts, in 16 MB tensors."""
    per = total_bytes // 3 // 4
    chunk = 4 << 20
    def part():
        out, left = [], per
        while left > 0:
            out.append(torch.randn(min(chunk, left)))
            left -= chunk
        return out
    weights = part()
    return {"state_dict": {f"w{i}": t for i, t in enumerate(weights)},
            "optimizer_states": [{"state": {i: {"step": torch.tensor(1.0), "exp_avg": a, "exp_avg_sq": b}
                                            for i, (a, b) in enumerate(zip(part(), part()))}}]}


def tensors_of(state):
    yield from state["state_dict"].values()
    for s in state["optimizer_states"][0]["state"].values():
        yield s["exp_avg"]
        yield s["exp_avg_sq"]


def timed(fn, rounds=3):
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


path = os.path.join(work, "torch_save.ckpt")
out = []
for mb in sizes:
    total = int(snapshot_mb("sync", mb) * 1e6)
    state = state_of(total)
    # A fresh copy each round, as a snapshot is: page faults included.
    copy_ms = timed(lambda: [t.clone() for t in tensors_of(state)])

    def save(fsync):
        with open(path, "wb") as f:
            torch.save(state, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    save_ms = timed(lambda: save(False))
    save_fsync_ms = timed(lambda: save(True))
    os.remove(path)
    out.append((mb, total / 1e6, copy_ms, save_ms, save_fsync_ms))
    print(f"{total / 1e6:.0f} MB: in-memory copy {copy_ms:.0f} ms, torch.save {save_ms:.0f} ms, "
          f"torch.save + fsync {save_fsync_ms:.0f} ms", flush=True)
    del state

with open(os.path.join(here, "async_ckpt_python.csv"), "w") as f:
    f.write("target_mb,state_mb,copy_ms,torch_save_ms,torch_save_fsync_ms\n")
    for r in out:
        f.write("%d,%.1f,%.1f,%.1f,%.1f\n" % r)

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 4.5))
for mode, label, style in (("sync", "kiln, synchronous commit", "o-"), ("async", "kiln, asynchronous commit", "s-")):
    pts = sorted((float(r["snapshot_mb"]), float(r["stall_ms"])) for r in rows if r["mode"] == mode)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], style, label=label)
ax.plot([r[1] for r in out], [r[3] / 1e3 for r in out], "^--", label="torch.save (Lightning), no fsync")
ax.plot([r[1] for r in out], [r[4] / 1e3 for r in out], "v--", label="torch.save + fsync")
ax.plot([r[1] for r in out], [r[2] / 1e3 for r in out], ":", color="gray", label="in-memory copy of the state")
ax.set_xlabel("checkpoint state (MB: weights + Adam moments)")
ax.set_ylabel("step loop blocked per checkpoint (s)")
ax.set_xscale("log")
ax.set_yscale("log")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
ax.set_title("Checkpoint stall against state size (charlm, 2 cores)")
fig.tight_layout()
fig.savefig(os.path.join(here, "async_ckpt.png"), dpi=110)
print("wrote bench/async_ckpt.png")
