#!/usr/bin/env python3
"""OpenMPI allreduce reference: same method and JSON schema as
`phalanx bench allreduce --json` and bench/gloo_allreduce.py (float32 sum with
comm.Allreduce on numpy buffers, a correctness check, warm-up, a barrier before
each timed iteration, median over iterations of the slowest rank's time).

Run under mpirun with Debian's Python (mpi4py lives there), e.g.

  mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl vader,self \
      /usr/bin/python3 bench/mpi_allreduce.py --sizes 4KiB,1MiB,16MiB,64MiB
  mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl tcp,self \
      --mca btl_tcp_if_include lo /usr/bin/python3 bench/mpi_allreduce.py

The algo field is "mpi-vader" or "mpi-tcp" (from the btl mpirun selected, or
--algo), the transport field "shm" or "tcp". Rank 0 prints one JSON line per size.
"""
import argparse, json, os, statistics, sys, time

import numpy as np
from mpi4py import MPI


def parse_size(s):
    for suf, m in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("B", 1)):
        if s.endswith(suf):
            return int(s[: -len(suf)]) * m
    return int(s)


def algo_from_env():
    """Names the run after the byte transfer layer mpirun was given (--mca btl)."""
    btl = os.environ.get("OMPI_MCA_btl", "")
    if "vader" in btl or "sm" in btl.split(","):
        return "mpi-vader", "shm"
    if "tcp" in btl:
        return "mpi-tcp", "tcp"
    return "mpi", btl or "default"


def iters_for(size, flag):
    """The iteration count phalanx bench allreduce picks (at least 20, about 256 MiB moved, at most 1000)."""
    return flag if flag > 0 else min(max(20, (256 << 20) // max(size, 1)), 1000)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB,16MiB,64MiB")
    ap.add_argument("--iters", type=int, default=0, help="timed iterations per size; 0 picks by size as phalanx does")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--algo", default="", help="algo field (default: mpi-vader or mpi-tcp from OMPI_MCA_btl)")
    ap.add_argument("--transport", default="", help="transport field (default: shm or tcp from OMPI_MCA_btl)")
    a = ap.parse_args()
    algo, transport = algo_from_env()
    algo, transport = a.algo or algo, a.transport or transport

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    for size in sizes:
        if size % 4:
            sys.exit(f"mpi_allreduce: size {size} is not a whole number of float32s")
    big = np.empty(max(sizes) // 4, dtype=np.float32)
    out_big = np.empty_like(big)
    for size in sizes:
        n = size // 4
        x, y = big[:n], out_big[:n]
        # Correctness first: every rank contributes rank+1.
        x.fill(rank + 1)
        comm.Allreduce(x, y, op=MPI.SUM)
        want = world * (world + 1) // 2
        if n and not np.all(y == want):
            sys.exit(f"mpi_allreduce: rank {rank}: allreduce of {size} bytes gave {y[np.argmax(y != want)]}, want {want}")
        x.fill(0)
        for _ in range(a.warmup):
            comm.Allreduce(x, y, op=MPI.SUM)
        iters = iters_for(size, a.iters)
        times = np.zeros(iters, dtype=np.float64)
        for i in range(iters):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(x, y, op=MPI.SUM)
            times[i] = time.perf_counter() - t0
        slowest = np.empty_like(times)
        comm.Allreduce(times, slowest, op=MPI.MAX)
        if rank == 0:
            med = statistics.median(slowest.tolist())
            algbw = size / med / 1e9
            print(json.dumps(dict(op="allreduce", ranks=world, bytes=size, algo=algo, transport=transport, iters=iters,
                                  median_s=med, algbw_GBps=algbw, busbw_GBps=algbw * 2 * (world - 1) / world)),
                  flush=True)


if __name__ == "__main__":
    main()
