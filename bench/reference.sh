#!/usr/bin/env bash
# The data plane against its references, in one run on this machine, N ranks
# (RANKS, default 4) as OS processes on one host, float32 sum-allreduce:
#   - the raw loopback stream (phalanx bench tcp): the ceiling of any TCP ring;
#   - Phalanx over TCP (--transport tcp; algos ALGOS, default "auto ring");
#   - Phalanx over shared memory (--transport shm, algo auto), when this build has it;
#   - PyTorch 1.13 / Gloo (bench/gloo_allreduce.py);
#   - OpenMPI 4.1 shared memory (btl vader,self) and TCP over lo (btl tcp,self),
#     through mpi4py (bench/mpi_allreduce.py).
# Every run uses the same method (warm-up, barrier before each timed iteration,
# median over iterations of the slowest rank's time) and prints the JSON lines of
# `phalanx bench allreduce --json` into bench/out/reference.jsonl. The runs are
# interleaved and repeated REPEAT times (default 3); the tables
# (bench/reference_table.py) show medians over the repetitions, which damps a
# noisy shared host. The 1-minute load average before and after is printed:
# figures from a loaded machine are indicative only.
#
#   bash bench/reference.sh                         # everything, 3 rounds
#   REPEAT=1 SIZES=4KiB,1MiB bash bench/reference.sh
#   python3 bench/reference_table.py bench/out/reference.jsonl   # the tables again
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-4}
SIZES=${SIZES:-4KiB,1MiB,16MiB,64MiB}
REPEAT=${REPEAT:-3}
ALGOS=${ALGOS:-auto ring}
ITERS=${ITERS:-0}     # timed iterations per size; 0 picks by size (at least 20, about 256 MiB moved)
scripts/install-bench-deps
mkdir -p bench/out
go build -o bench/out/phalanx ./cmd/phalanx
phalanx=bench/out/phalanx
transports=(tcp)
if "$phalanx" bench allreduce --help 2>&1 | grep -A1 -E '^ +--?transport ' | grep -qw shm; then
  transports+=(shm)
else
  echo "reference.sh: warning: this phalanx has no 'bench allreduce --transport shm'; measuring TCP only" >&2
fi
mpi=(mpirun --allow-run-as-root --oversubscribe -np "$RANKS")
mpiargs=(--sizes "$SIZES" --iters "$ITERS")
out=bench/out/reference.jsonl
: > "$out"
load() { cut -d' ' -f1 /proc/loadavg; }
echo "{\"op\":\"load\",\"when\":\"before\",\"load1\":$(load)}" >> "$out"
for round in $(seq "$REPEAT"); do
  echo "reference.sh: round $round/$REPEAT" >&2
  "$phalanx" bench tcp --json >> "$out"
  for tr in "${transports[@]}"; do
    algos=$ALGOS
    [ "$tr" = shm ] && algos=auto
    for algo in $algos; do
      "$phalanx" bench allreduce --ranks "$RANKS" --sizes "$SIZES" --iters "$ITERS" --transport "$tr" --algo "$algo" --json >> "$out"
    done
  done
  /usr/bin/python3 bench/gloo_allreduce.py --ranks "$RANKS" --sizes "$SIZES" --iters "$ITERS" >> "$out"
  "${mpi[@]}" --mca btl vader,self /usr/bin/python3 bench/mpi_allreduce.py "${mpiargs[@]}" >> "$out"
  "${mpi[@]}" --mca btl tcp,self --mca btl_tcp_if_include lo /usr/bin/python3 bench/mpi_allreduce.py "${mpiargs[@]}" >> "$out"
done
echo "{\"op\":\"load\",\"when\":\"after\",\"load1\":$(load)}" >> "$out"
cat "$out"
/usr/bin/python3 bench/reference_table.py "$out"
