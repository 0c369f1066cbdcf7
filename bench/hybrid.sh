#!/usr/bin/env bash
# Hybrid-synchronous figures (issue 6), in one run: 4 workers training the MLP
#   undisturbed (BSP), one worker 3x slower in BSP (every step waits for it),
#   and the same in --sync hybrid (steps close at the deadline without it;
#   it is excluded and readmitted).
# Useful throughput = samples whose gradients entered an update per second of
# training (from the step events); steps to a fixed loss = the first step
# whose 10-step mean loss is at most the loss the undisturbed run reaches at
# 60% of its steps.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/out}
mkdir -p "$out"
go build -o "$out/phalanx" ./cmd/phalanx
steps=${STEPS:-200}
common=(--workers 4 --steps "$steps" --threads 1 --seed 7)
slow=(--inject-slow "rank=3,factor=3,from=20,to=$((steps * 2 / 3))")
rm -f "$out/undisturbed.jsonl" "$out/bsp.jsonl" "$out/hybrid.jsonl" # --events appends
"$out/phalanx" train "${common[@]}" --events "$out/undisturbed.jsonl" >/dev/null
"$out/phalanx" train "${common[@]}" "${slow[@]}" --events "$out/bsp.jsonl" >/dev/null
"$out/phalanx" train "${common[@]}" "${slow[@]}" --sync hybrid --events "$out/hybrid.jsonl" >/dev/null
python3 - "$out" "$steps" <<'PY'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
def load(name):
    ev = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    st = [e for e in ev if e["event"] == "step"]
    useful = sum(e["samples_per_s"] * e["step_s"] for e in st)
    secs = sum(e["step_s"] for e in st)
    loss = [e["loss"] for e in st]
    done = [e for e in ev if e["event"] == "done"][0]
    kinds = {k: sum(1 for e in ev if e["event"] == k) for k in ("straggler_excluded", "straggler_readmitted")}
    return dict(tput=useful / secs, loss=loss, acc=done["accuracy"], **kinds)
def steps_to(loss, target):
    for i in range(10, len(loss) + 1):
        if sum(loss[i-10:i]) / 10 <= target:
            return i
    return None
u, b, h = load("undisturbed"), load("bsp"), load("hybrid")
target = sum(u["loss"][int(steps*0.6)-10:int(steps*0.6)]) / 10
su = steps_to(u["loss"], target)
print(f"{'run':<12} {'useful samples/s':>17} {'vs undisturbed':>15} {'steps to loss':>14} {'accuracy':>9} {'excluded':>9} {'readmitted':>11}")
for name, r in (("undisturbed", u), ("bsp, 1 slow", b), ("hybrid, 1 slow", h)):
    s = steps_to(r["loss"], target)
    print(f"{name:<12} {r['tput']:>17.0f} {r['tput']/u['tput']:>15.2f} {str(s):>14} {r['acc']:>9.4f} {r['straggler_excluded']:>9} {r['straggler_readmitted']:>11}")
print(f"target: hybrid >= 0.9 x 3/4 = {0.675:.3f} of undisturbed; steps to loss {target:.4f}: undisturbed {su}")
PY
