#!/usr/bin/env python3
"""PyTorch 1.13 DDP/Gloo reference for `phalanx train`: MLP 784-512-512-10,
global batch 256 split over N ranks, one thread per rank, SGD with momentum,
random data. Prints one JSON line: median samples/s over the timed steps.

Run it with Debian's Python (/usr/bin/python3) after scripts/install-bench-deps,
which points the libblas.so.3 that python3-torch loads at OpenBLAS and checks
it; OpenBLAS runs one thread per rank (OPENBLAS_NUM_THREADS=1, set here before
torch loads unless the environment sets it)."""
import argparse, json, os, socket, statistics, time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def blas_loaded():
    """The BLAS libraries this process has mapped (symlinks resolved by the kernel)."""
    with open("/proc/self/maps") as f:
        libs = {l.split()[-1] for l in f if len(l.split()) >= 6 and ("libblas" in l or "openblas" in l)}
    return ",".join(sorted("/".join(l.split("/")[-2:]) for l in libs)) or "none"


def worker(rank, world, port, steps, warmup, batch, out):
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    local = batch // world
    x = torch.randn(local, 784)
    y = torch.randint(0, 10, (local,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(dict(op="train", impl="pytorch-ddp-gloo", workers=world, batch=batch,
                     samples_per_s=batch / statistics.median(t.tolist()), blas=blas_loaded(),
                     threads=torch.get_num_threads()))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").Queue()
    mp.spawn(worker, args=(a.workers, port, a.steps, a.warmup, a.batch, q), nprocs=a.workers, join=True)
    print(json.dumps(q.get()))


if __name__ == "__main__":
    main()
