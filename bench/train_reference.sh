#!/usr/bin/env bash
# Training throughput, Phalanx against PyTorch 1.13 DDP/Gloo, in one run on this
# machine: MLP 784-512-512-10, global batch 256, one thread per worker, N = 1, 2
# and 4 (override with WORKERS). Each configuration runs REPEAT times
# (default 3), interleaved; the table shows medians, and for Phalanx the share
# of a step spent waiting for the gradient allreduce (comm %, control-plane
# round trip included) and outside both model compute and that wait (other %).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-1 2 4}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-60}
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch
fi
mkdir -p bench/out
go build -o bench/out/phalanx ./cmd/phalanx
out=bench/out/train_reference.jsonl
: > "$out"
for _ in $(seq "$REPEAT"); do
  for n in $WORKERS; do
    ev=bench/out/train-events-$n.jsonl
    bench/out/phalanx train --workers "$n" --steps "$STEPS" --threads 1 --samples 20000 --events "$ev" > /dev/null
    # Median samples/s of the steps after the first five (warm-up).
    /usr/bin/python3 - "$ev" "$n" >> "$out" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"event":"step"' in l]
timed = [s for s in steps if s["step"] > 5]
other = statistics.median((s["step_s"] - s["compute_s"] - s["comm_s"]) / s["step_s"] for s in timed)
print(json.dumps(dict(op="train", impl="phalanx", workers=int(sys.argv[2]), batch=256,
                      samples_per_s=statistics.median(s["samples_per_s"] for s in timed),
                      comm_share=statistics.median(s["comm_s"] / s["step_s"] for s in timed), other_share=other)))
PY
    /usr/bin/python3 bench/ddp_mlp.py --workers "$n" --steps "$STEPS" >> "$out"
  done
done
cat "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
from collections import defaultdict
runs = defaultdict(list)
other = defaultdict(list)
comm = defaultdict(list)
for l in open(sys.argv[1]):
    r = json.loads(l)
    runs[(r["impl"], r["workers"])].append(r["samples_per_s"])
    if "other_share" in r:
        other[r["workers"]].append(r["other_share"])
        comm[r["workers"]].append(r["comm_share"])
med = {k: statistics.median(v) for k, v in runs.items()}
print(f"\n{'workers':>7} {'phalanx':>10} {'ddp':>10} {'x ddp':>6} {'phalanx eff':>11} {'ddp eff':>8} {'comm %':>7} {'other %':>8}")
for n in sorted({k[1] for k in med}):
    p, d = med.get(("phalanx", n)), med.get(("pytorch-ddp-gloo", n))
    ep = p / n / med[("phalanx", 1)] if ("phalanx", 1) in med else float("nan")
    ed = d / n / med[("pytorch-ddp-gloo", 1)] if ("pytorch-ddp-gloo", 1) in med else float("nan")
    print(f"{n:>7} {p:>10.0f} {d:>10.0f} {p/d:>6.2f} {ep:>11.2f} {ed:>8.2f} {100*statistics.median(comm[n]):>7.2f} {100*statistics.median(other[n]):>8.2f}")
PY
