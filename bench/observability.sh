#!/usr/bin/env bash
# The cost of watching a job: the main job (mlp, 4 workers, 300 steps) with
# and without --metrics and --trace, in turn (off, on, off, on, ...), and
# the median step time of each run's steps 20..300 from its event log.
# Prints a table and the ratio on/off of the medians over the pairs; the
# issue allows at most 1.03.
#   PAIRS=3 bash bench/observability.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
pairs="${PAIRS:-3}"
bash "$root/scripts/phalanx" version >/dev/null
bin="$root/bin/phalanx"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() { # name, extra flags...
  local name=$1
  shift
  "$bin" train --example mlp --workers 4 --steps 300 --events "$dir/$name.events" "$@" >"$dir/$name.out" 2>&1
}
for i in $(seq 1 "$pairs"); do
  run "off-$i"
  run "on-$i" --metrics 127.0.0.1:0 --trace "$dir/on-$i.trace.json"
done
python3 - "$dir" "$pairs" <<'PY'
import json, statistics, sys
d, pairs = sys.argv[1], int(sys.argv[2])
def median_step(name):
    steps = {}
    for line in open(f"{d}/{name}.events"):
        e = json.loads(line)
        if e["event"] == "step" and 20 <= e["step"] <= 300:
            steps[e["step"]] = e["step_s"]
    return statistics.median(steps.values())
print("| pair | off: median step (ms) | on: median step (ms) | on/off |")
print("|---|---|---|---|")
ratios = []
for i in range(1, pairs + 1):
    off, on = median_step(f"off-{i}"), median_step(f"on-{i}")
    ratios.append(on / off)
    print(f"| {i} | {off*1e3:.2f} | {on*1e3:.2f} | {on/off:.3f} |")
print(f"| median | | | {statistics.median(ratios):.3f} |")
PY
