#!/usr/bin/env python3
"""PyTorch/Gloo allreduce reference: same method and JSON schema as
`phalanx bench allreduce --json` (float32 sum, barrier before each timed
iteration, median over iterations of the slowest rank's time)."""
import argparse, json, os, socket, statistics, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    for suf, m in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("B", 1)):
        if s.endswith(suf):
            return int(s[: -len(suf)]) * m
    return int(s)


def worker(rank, world, port, sizes, iters_flag, warmup, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for size in sizes:
        x = torch.zeros(size // 4, dtype=torch.float32)
        iters = iters_flag or min(max(20, (256 << 20) // size), 1000)
        for _ in range(warmup):
            dist.all_reduce(x)
        times = torch.zeros(iters, dtype=torch.float64)
        for i in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times[i] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if rank == 0:
            med = statistics.median(times.tolist())
            algbw = size / med / 1e9
            out.put(dict(op="allreduce", ranks=world, bytes=size, algo="gloo", transport="tcp", iters=iters,
                         median_s=med, algbw_GBps=algbw, busbw_GBps=algbw * 2 * (world - 1) / world))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB,64MiB")
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(a.ranks, port, sizes, a.iters, a.warmup, q), nprocs=a.ranks, join=True)
    while not q.empty():
        print(json.dumps(q.get()))


if __name__ == "__main__":
    main()
