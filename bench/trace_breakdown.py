#!/usr/bin/env python3
"""The step's breakdown from a job's trace (phalanx train --trace FILE).

For each process: the median duration (ms) of each span on the step thread,
the median gaps between consecutive step spans (time in none of them), the
median duration of the step's allreduces by size, and the forward/backward
spread (p10, p50, p90). Steps FIRST..LAST only (default 20..110: past the
warm-up, before the end).

    python3 bench/trace_breakdown.py job.trace.json [FIRST LAST]
"""
import collections
import json
import statistics
import sys


def pct(xs, p):
    xs = sorted(xs)
    return xs[int(p * (len(xs) - 1))] if xs else float("nan")


def main():
    path = sys.argv[1]
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    last = int(sys.argv[3]) if len(sys.argv) > 3 else 110
    events = json.load(open(path))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e["ph"] == "X"]
    for pid in sorted(names):
        mine = sorted((e for e in spans if e["pid"] == pid), key=lambda e: e["ts"])
        step = [e for e in mine if e.get("cat") == "step" and first <= e.get("args", {}).get("step", 0) <= last]
        dur = collections.defaultdict(list)
        for e in step:
            dur[e["name"]].append(e.get("dur", 0) / 1000)
        gaps = collections.defaultdict(list)
        for a, b in zip(step, step[1:]):
            gaps[f"{a['name']} → {b['name']}"].append((b["ts"] - a["ts"] - a.get("dur", 0)) / 1000)
        lo = min((e["ts"] for e in step), default=0)
        hi = max((e["ts"] + e.get("dur", 0) for e in step), default=0)
        coll = collections.defaultdict(list)
        for e in mine:
            if e.get("cat") == "collectives" and e["name"] == "allreduce" and lo <= e["ts"] <= hi:
                coll[e["args"].get("bytes", 0)].append(e.get("dur", 0) / 1000)
        print(f"{names[pid]}")
        print("  spans (median ms): " + " | ".join(f"{k} {statistics.median(v):.2f}" for k, v in dur.items()))
        print("  gaps (median ms):  " + " | ".join(f"{k} {statistics.median(v):.2f}" for k, v in gaps.items()))
        print("  allreduces (median ms): " + " | ".join(f"{b} B {statistics.median(v):.2f}" for b, v in sorted(coll.items()) if len(v) > 5))
        fb = dur.get("forward/backward", [])
        print(f"  forward/backward p10 {pct(fb, .1):.2f} p50 {pct(fb, .5):.2f} p90 {pct(fb, .9):.2f}")


if __name__ == "__main__":
    main()
