#!/usr/bin/env python3
"""The cost-curve table and plot from bench/cost_curve.sh's per-epoch CSV.

    python3 bench/cost_curve.py EPOCHS_CSV MEDIANS_CSV PNG [--note TEXT]

Per side and batch size: the median seconds per epoch (every epoch covers the
60000 training samples once, across all processes), the optimizer steps per
epoch each process takes, and microseconds per step. Per side, a fit of
time/step = a + b * batch (weighted by 1/time, i.e. least relative error, so
the small batches that decide `a` count as much as the large ones): `a` is
the fixed cost of a step, whatever its size; b is the cost per sample.
"""
import argparse
import csv
import math
import statistics
from collections import defaultdict

SAMPLES = 60000  # Fashion-MNIST's training set; val_size = 0

LABELS = {
    ("hand", 1): "hand-written LibTorch loop (the floor)",
    ("kiln", 1): "kiln, 1 process",
    ("kiln", 2): "kiln, 2 processes (-n 2, batch per process)",
}
STYLE = {("hand", 1): ("#444444", "s"), ("kiln", 1): ("#d9480f", "o"), ("kiln", 2): ("#1971c2", "^")}


def steps_per_epoch(processes, batch):
    # Each process takes an equal shard (padded): ceil(60000 / processes) samples.
    return math.ceil(math.ceil(SAMPLES / processes) / batch)


def fit_line(xs, ys):
    """Weighted least squares y = a + b x with weights 1/y^2 on the squared residuals."""
    w = [1.0 / (y * y) for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sy = sum(wi * y for wi, y in zip(w, ys))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    a = (sy - b * sx) / sw
    return a, b


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("epochs_csv")
    parser.add_argument("medians_csv")
    parser.add_argument("png")
    parser.add_argument("--note", default="")
    args = parser.parse_args()

    epochs = defaultdict(list)
    with open(args.epochs_csv) as f:
        for row in csv.DictReader(f):
            epochs[(row["side"], int(row["processes"]), int(row["batch"]))].append(float(row["seconds"]))

    series = defaultdict(list)  # (side, processes) -> [(batch, median s/epoch, us/step, n)]
    for (side, processes, batch), seconds in sorted(epochs.items()):
        median = statistics.median(seconds)
        us = 1e6 * median / steps_per_epoch(processes, batch)
        series[(side, processes)].append((batch, median, us, len(seconds)))

    fits = {}
    for key, points in series.items():
        if len(points) >= 2:
            fits[key] = fit_line([p[0] for p in points], [p[2] for p in points])

    hand = {p[0]: p[1] for p in series.get(("hand", 1), [])}
    with open(args.medians_csv, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["side", "processes", "batch_per_process", "epochs", "median_s_per_epoch", "samples_per_s",
                      "steps_per_epoch", "us_per_step", "ratio_to_hand", "fit_fixed_us_per_step",
                      "fit_us_per_sample"])
        for key in sorted(series):
            a, b = fits.get(key, (float("nan"), float("nan")))
            for batch, median, us, n in series[key]:
                ratio = median / hand[batch] if batch in hand else float("nan")
                out.writerow([key[0], key[1], batch, n, f"{median:.4f}", f"{SAMPLES / median:.0f}",
                              steps_per_epoch(key[1], batch), f"{us:.1f}", f"{ratio:.3f}", f"{a:.1f}", f"{b:.3f}"])

    # The table, for the terminal and bench/README.md.
    batches = sorted({p[0] for points in series.values() for p in points})
    keys = [k for k in [("hand", 1), ("kiln", 1), ("kiln", 2)] if k in series]
    print("s/epoch (median) by batch size per process; kiln/hand in brackets")
    print("| batch | " + " | ".join(LABELS[k].split(" (")[0] for k in keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for batch in batches:
        cells = []
        for k in keys:
            value = {p[0]: p[1] for p in series[k]}.get(batch)
            if value is None:
                cells.append("")
            elif k != ("hand", 1) and batch in hand:
                cells.append(f"{value:.3f} ({value / hand[batch]:.2f})")
            else:
                cells.append(f"{value:.3f}")
        print(f"| {batch} | " + " | ".join(cells) + " |")
    for k in keys:
        if k in fits:
            a, b = fits[k]
            print(f"{LABELS[k]}: time/step = {a:.0f} us + {b:.2f} us x batch")
    if ("hand", 1) in fits and ("kiln", 1) in fits:
        print(f"kiln's fixed cost per step over the hand loop's: {fits[('kiln', 1)][0] - fits[('hand', 1)][0]:.0f} us")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    fig, (left, right, rel) = plt.subplots(1, 3, figsize=(18, 5.4), gridspec_kw={"width_ratios": [1, 1.15, 0.85]})
    for k in keys:
        color, marker = STYLE[k]
        xs = [p[0] for p in series[k]]
        left.plot(xs, [p[1] for p in series[k]], marker=marker, color=color, label=LABELS[k])
        label = LABELS[k].split(" (")[0]
        if k in fits:
            a, b = fits[k]
            label += f": {a:.0f} µs fixed + {b:.2f} µs/sample"
            grid = [xs[0] * (xs[-1] / xs[0]) ** (i / 50) for i in range(51)]
            right.plot(grid, [a + b * x for x in grid], linestyle="--", linewidth=1, color=color)
        right.plot(xs, [p[2] for p in series[k]], marker=marker, linestyle="none", color=color, label=label)
        if k != ("hand", 1) and hand:
            pts = [(p[0], p[1] / hand[p[0]]) for p in series[k] if p[0] in hand]
            rel.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=LABELS[k].split(" (")[0])
            for x, y in pts:
                rel.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7,
                             color=color)
    rel.axhline(1.0, color=STYLE[("hand", 1)][0], linewidth=1.5, label="hand-written loop = 1")

    for ax in (left, right, rel):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xlabel("batch size (per process)")
    left.set_ylabel("seconds per epoch (60000 samples)")
    left.set_title("Time per epoch (lower is better)")
    left.legend(fontsize=8)
    right.set_ylabel("µs per optimizer step")
    right.set_title("Time per step; dashed: fit a + b·batch (a: fixed cost per step)")
    right.legend(fontsize=8, loc="upper left")
    rel.set_ylabel("s/epoch ÷ hand-written loop's s/epoch")
    rel.set_title("Against the floor (below 1: faster than the hand loop)")
    rel.legend(fontsize=8)
    fig.suptitle("mlp256 (784-256-128-10), Adam 1e-3, Fashion-MNIST, 1 intra-op thread per process; medians"
                 + (f" — {args.note}" if args.note else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.medians_csv} and {args.png}")


if __name__ == "__main__":
    main()
