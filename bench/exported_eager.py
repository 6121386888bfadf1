"""The reference benchmark (shared/bench-definition.md) as a plain PyTorch
loop, eager or torch.compile'd, and the same model exported for kiln.

    python bench/exported_eager.py export mlp32 OUT.pt2
    python bench/exported_eager.py eager|compile mlp32 THREADS

Prints "epoch N seconds S" for each timed epoch (bench/exported.sh reads
them), then the test accuracy. The model is built after torch.manual_seed(0)
as kiln_mlp builds its own.
"""
import gzip
import sys
import time

import torch
from torch import nn

WIDTHS = {"mlp32": [784, 32, 10], "mlp256": [784, 256, 128, 10]}
BATCH = {"mlp32": 32, "mlp256": 128}
ROOT = "/usr/share/datasets/fashion-mnist"


class Mlp(nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def idx(name, offset):
    with gzip.open(f"{ROOT}/{name}.gz", "rb") as f:
        return torch.frombuffer(bytearray(f.read()[offset:]), dtype=torch.uint8)


def main():
    what, model_name = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = Mlp(WIDTHS[model_name])
    if what == "export":
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "python"))
        import kiln_export

        kiln_export.export(model, torch.zeros(2, 784), sys.argv[3])
        return
    torch.set_num_threads(int(sys.argv[3]))
    x = idx("train-images-idx3-ubyte", 16).view(-1, 784).float() / 255
    y = idx("train-labels-idx1-ubyte", 8).long()
    tx = idx("t10k-images-idx3-ubyte", 16).view(-1, 784).float() / 255
    ty = idx("t10k-labels-idx1-ubyte", 8).long()
    step_model = torch.compile(model) if what == "compile" else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = BATCH[model_name]

    def step(xb, yb):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(step_model(xb), yb)
        loss.backward()
        opt.step()

    # Warm-up on the model itself (compile's first calls trace and compile).
    for i in range(50):
        step(x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch])
    g = torch.Generator().manual_seed(0)
    for epoch in range(3):
        order = torch.randperm(60000, generator=g)
        start = time.perf_counter()
        for i in range(0, 60000, batch):
            b = order[i:i + batch]
            step(x.index_select(0, b), y.index_select(0, b))
        print(f"epoch {epoch} seconds {time.perf_counter() - start:.4f}", flush=True)
    with torch.no_grad():
        print("test accuracy", float((model(tx).argmax(1) == ty).float().mean()))


if __name__ == "__main__":
    main()
