#!/usr/bin/env bash
# Training throughput, Phalanx against PyTorch 1.13 DDP/Gloo, in one run on this
# machine: MLP 784-512-512-10, global batch 256, one compute thread per process
# (OPENBLAS_NUM_THREADS=1 for both; torch.set_num_threads(1) for PyTorch, whose
# Gloo and autograd threads run beside it; Phalanx's default --threads, which
# with OpenBLAS leaves each worker one Go thread beside the matrix products,
# see launch.ComputeThreads), N = 1, 2 and 4 processes (override with WORKERS). PyTorch runs on
# OpenBLAS: scripts/install-bench-deps selects it for python3-torch and refuses
# to go on if torch's matmul is not fast. Phalanx is built with OpenBLAS too
# (go build -tags openblas) when nn/ has that build (nn/blas_openblas.go);
# otherwise, or when that build fails, with the default pure-Go BLAS and a
# warning. Each configuration runs REPEAT times (default 3), interleaved; the
# table (bench/train_table.py) shows medians, ours / DDP, and for Phalanx the
# share of a step spent waiting for the gradient allreduce after the backward
# pass (comm %, control-plane round trip included: what overlap did not hide)
# and outside both model compute and that wait (other %).
#
#   bash bench/train_reference.sh
#   REPEAT=1 STEPS=30 WORKERS="1 2" bash bench/train_reference.sh
#   PHALANX_ARGS="--transport tcp" bash bench/train_reference.sh
#   python3 bench/train_table.py bench/out/train_reference.jsonl   # the table again
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-1 2 4}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-60}
PHALANX_ARGS=${PHALANX_ARGS:-}   # more phalanx train flags, e.g. "--transport shm"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
scripts/install-bench-deps
mkdir -p bench/out
build=purego
if [ -f nn/blas_openblas.go ]; then
  if [ -f scripts/install-openblas ]; then bash scripts/install-openblas; fi
  if CGO_ENABLED=1 go build -tags openblas -o bench/out/phalanx ./cmd/phalanx; then
    build=openblas
  else
    echo "train_reference.sh: warning: 'go build -tags openblas' failed; measuring the default (pure-Go BLAS) build" >&2
  fi
else
  echo "train_reference.sh: warning: nn/ has no OpenBLAS build (nn/blas_openblas.go) yet; measuring the pure-Go BLAS build" >&2
fi
if [ "$build" = purego ]; then go build -o bench/out/phalanx ./cmd/phalanx; fi
out=bench/out/train_reference.jsonl
: > "$out"
echo "{\"op\":\"meta\",\"phalanx_build\":\"$build\",\"phalanx_args\":\"$PHALANX_ARGS\",\"steps\":$STEPS,\"load1_before\":$(cut -d' ' -f1 /proc/loadavg)}" >> "$out"
for round in $(seq "$REPEAT"); do
  for n in $WORKERS; do
    echo "train_reference.sh: round $round/$REPEAT, $n workers" >&2
    ev=bench/out/train-events-$n.jsonl
    rm -f "$ev" # --events appends: the median must be this run's steps alone
    # shellcheck disable=SC2086 # PHALANX_ARGS is a list of flags
    bench/out/phalanx train --workers "$n" --steps "$STEPS" --batch 256 --samples 20000 \
      --events "$ev" $PHALANX_ARGS > /dev/null
    # Median samples/s of the steps after the first five (warm-up).
    /usr/bin/python3 - "$ev" "$n" "$build" >> "$out" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"event":"step"' in l]
timed = [s for s in steps if s["step"] > 5]
other = statistics.median((s["step_s"] - s["compute_s"] - s["comm_s"]) / s["step_s"] for s in timed)
print(json.dumps(dict(op="train", impl="phalanx", workers=int(sys.argv[2]), batch=256, build=sys.argv[3],
                      samples_per_s=statistics.median(s["samples_per_s"] for s in timed),
                      comm_share=statistics.median(s["comm_s"] / s["step_s"] for s in timed), other_share=other)))
PY
    /usr/bin/python3 bench/ddp_mlp.py --workers "$n" --steps "$STEPS" --batch 256 >> "$out"
  done
done
echo "{\"op\":\"meta\",\"load1_after\":$(cut -d' ' -f1 /proc/loadavg)}" >> "$out"
cat "$out"
/usr/bin/python3 bench/train_table.py "$out"
