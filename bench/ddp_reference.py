#!/usr/bin/env python3
"""PyTorch's own DistributedDataParallel on the reference data-parallel
workload (shared/bench-definition.md, "Data parallel on one machine"): what
kiln's 1-versus-2-process ratio is compared with.

    python bench/ddp_reference.py --processes 2 [--epochs 3] [--data DIR]

mlp256 (784-256-128-10), per-rank batch 128, Adam 1e-3, one intra-op thread
per process, Gloo on loopback; each epoch's randperm (a CPU generator seeded
0) is split as DistributedSampler does (rank r takes every world-th index
from r, padded to equal length). One process runs the same loop without DDP.
Prints one line per timed epoch ("epoch E seconds S") from rank 0, after a
50-batch warm-up on a throw-away model, as bench_hand_loop does.
"""
import argparse
import gzip
import os
import socket
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=4 + 4 * dims).reshape(shape)


def model():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def shard(order, rank, world):
    n = order.numel()
    per = (n + world - 1) // world
    padded = torch.cat([order, order[: per * world - n]]) if per * world > n else order
    return padded[rank::world]


def worker(rank, world, port, args, out):
    torch.set_num_threads(1)
    x = read_idx(os.path.join(args.data, "train-images-idx3-ubyte.gz")).reshape(-1, 784).float().div_(255)
    y = read_idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz")).long()
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)

    def wrap(net):
        return nn.parallel.DistributedDataParallel(net) if world > 1 else net

    def epoch(net, opt, order, max_batches=None):
        mine = shard(order, rank, world)
        batches = (mine.numel() + args.batch - 1) // args.batch
        if max_batches:
            batches = min(batches, max_batches)
        for b in range(batches):
            index = mine[b * args.batch:(b + 1) * args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(net(x.index_select(0, index)), y.index_select(0, index))
            loss.backward()
            opt.step()
        return loss.item()

    torch.manual_seed(0)
    warm = wrap(model())
    epoch(warm, torch.optim.Adam(warm.parameters(), lr=1e-3), torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0)), 50)
    torch.manual_seed(0)
    net = wrap(model())
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for e in range(args.epochs):
        order = torch.randperm(x.shape[0], generator=g)
        if world > 1:
            dist.barrier()
        start = time.perf_counter()
        loss = epoch(net, opt, order)
        if world > 1:
            dist.barrier()
        seconds = time.perf_counter() - start
        if rank == 0:
            print(f"epoch {e} seconds {seconds:.4f} loss {loss:.4f}", file=out, flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    if args.processes == 1:
        worker(0, 1, 0, args, sys.stdout)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(args.processes, port, args), nprocs=args.processes)


def _spawned(rank, world, port, args):
    worker(rank, world, port, args, sys.stdout)


if __name__ == "__main__":
    main()
