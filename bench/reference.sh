#!/usr/bin/env bash
# Runs, in one go on this machine: the raw loopback stream, Phalanx's allreduce
# (ring, tree and auto) and PyTorch 1.13/Gloo's allreduce, all with N ranks as
# OS processes on 127.0.0.1. Prints JSON lines and a ratio table. The runs are
# interleaved and repeated REPEAT times (default 3); the table shows, for every
# configuration, the median over repetitions, which damps a noisy shared host.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-4}
SIZES=${SIZES:-4KiB,64KiB,1MiB,16MiB,64MiB}
REPEAT=${REPEAT:-3}
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch
fi
mkdir -p bench/out
go build -o bench/out/phalanx ./cmd/phalanx
out=bench/out/reference.jsonl
: > "$out"
for _ in $(seq "$REPEAT"); do
  bench/out/phalanx bench tcp --json >> "$out"
  for algo in auto ring tree; do
    bench/out/phalanx bench allreduce --ranks "$RANKS" --sizes "$SIZES" --algo "$algo" --json >> "$out"
  done
  /usr/bin/python3 bench/gloo_allreduce.py --ranks "$RANKS" --sizes "$SIZES" >> "$out"
done
cat "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
from collections import defaultdict
raw = [json.loads(l) for l in open(sys.argv[1])]
tcp = statistics.median(r["GBps"] for r in raw if r["op"] == "tcp")
runs = defaultdict(list)
for r in raw:
    if r["op"] == "allreduce":
        runs[(r["algo"], r["bytes"])].append(r)
rows = []
for (algo, size), rs in runs.items():
    med = statistics.median(r["median_s"] for r in rs)
    r = dict(rs[0], median_s=med)
    r["algbw_GBps"] = size / med / 1e9
    r["busbw_GBps"] = r["algbw_GBps"] * 2 * (r["ranks"] - 1) / r["ranks"]
    rows.append(r)
gloo = {r["bytes"]: r for r in rows if r.get("algo") == "gloo"}
print(f"\nraw loopback stream: {tcp:.2f} GB/s (median of {len([r for r in raw if r['op'] == 'tcp'])} runs)")
print(f"{'algo':>6} {'bytes':>10} {'median_ms':>10} {'busbw':>7} {'x gloo bw':>9} {'x gloo time':>11} {'/ raw':>6}")
for r in rows:
    if r["op"] != "allreduce":
        continue
    g = gloo.get(r["bytes"])
    rb = r["busbw_GBps"] / g["busbw_GBps"] if g else float("nan")
    rt = g["median_s"] / r["median_s"] if g else float("nan")
    print(f"{r['algo']:>6} {r['bytes']:>10} {r['median_s']*1e3:>10.3f} {r['busbw_GBps']:>7.3f} {rb:>9.2f} {rt:>11.2f} {r['busbw_GBps']/tcp:>6.2f}")
PY
