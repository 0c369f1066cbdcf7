#!/usr/bin/env python3
"""Table of bench/train_reference.sh from its JSON lines
(bench/out/train_reference.jsonl): per N, the medians over repetitions of
Phalanx's and PyTorch DDP's samples/s, ours / DDP, the scaling efficiency of
each (samples/s per process against N = 1), and Phalanx's comm % and other %.

  python3 bench/train_table.py bench/out/train_reference.jsonl
"""
import json, statistics, sys
from collections import defaultdict

TARGET = {1: 1.0}  # issue 14: ours / DDP at least 1.0 at N = 1, 1.5 beyond
TARGET_DEFAULT = 1.5


def main(path):
    runs, other, comm, meta, blas = defaultdict(list), defaultdict(list), defaultdict(list), {}, set()
    for l in open(path):
        if not l.strip():
            continue
        r = json.loads(l)
        if r["op"] == "meta":
            meta.update(r)
            continue
        runs[(r["impl"], r["workers"])].append(r["samples_per_s"])
        if "other_share" in r:
            other[r["workers"]].append(r["other_share"])
            comm[r["workers"]].append(r["comm_share"])
        if "blas" in r:
            blas.add(r["blas"])
    med = {k: statistics.median(v) for k, v in runs.items()}
    nan = float("nan")
    args = meta.get("phalanx_args") or ""
    print(f"\nPhalanx build: {meta.get('phalanx_build', '?')} BLAS{', flags ' + args if args else ''}; "
          f"PyTorch DDP BLAS: {', '.join(sorted(blas)) or '?'}; steps per run: {meta.get('steps', '?')}; "
          f"1-minute load before {meta.get('load1_before', '?')}, after {meta.get('load1_after', '?')}")
    print("| processes | Phalanx samples/s | PyTorch DDP (gloo, OpenBLAS) samples/s | ours / DDP | target | "
          "Phalanx eff | DDP eff | comm % | other % | reps |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sorted({k[1] for k in med}):
        p, d = med.get(("phalanx", n), nan), med.get(("pytorch-ddp-gloo", n), nan)
        p1, d1 = med.get(("phalanx", 1)), med.get(("pytorch-ddp-gloo", 1))
        ep = p / n / p1 if p1 else nan
        ed = d / n / d1 if d1 else nan
        c = 100 * statistics.median(comm[n]) if comm[n] else nan
        o = 100 * statistics.median(other[n]) if other[n] else nan
        reps = min(len(runs.get(("phalanx", n), [])), len(runs.get(("pytorch-ddp-gloo", n), [])))
        print(f"| {n} | {p:,.0f} | {d:,.0f} | {p / d:.2f} | {TARGET.get(n, TARGET_DEFAULT):.1f} | "
              f"{ep:.2f} | {ed:.2f} | {c:.1f} | {o:.1f} | {reps} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/out/train_reference.jsonl")
