#!/usr/bin/env python3
"""The tensor-parallel figures of the README's "Model parallelism in one
page": one run, ratios against references measured in the same run.

  python3 bench/gpt_figures.py [PHALANX_BINARY]        (default: bin/phalanx)

Every process is limited to one core (--threads 1; OPENBLAS_NUM_THREADS=1).
The model is the gpt example's default (width 256, 4 blocks of 4 heads,
context 128) unless WIDTH, DEPTH, HEADS, CONTEXT say otherwise. Tables, in
markdown:
  1. throughput: --tp 2 against the unsplit model on one worker
     (--workers 1), A B A B, samples/s (median of the steps after the
     first WARMUP), and the share of a tensor-parallel rank's step spent
     in its collectives (pipeline_step wait_s over step_s);
  2. accuracy: the training loss curve at --tp 2 against --tp 1 (the
     unsplit model on the same kind: the same samples), the largest
     relative gap between their means over windows of 10 steps, and the
     held-out loss of each;
  3. the model's own speed: --workers 1 against bench/gpt_torch.py (the
     same architecture in PyTorch, one thread) in the same run.
Environment: BATCH (default 8), STEPS (default 30), WARMUP (default 5),
REPS (pairs, default 2), ONLY (throughput, or torch: that table alone), CURVE_STEPS (the accuracy runs, default 200,
on a model of width 64 and 2 blocks, context 64, batch 16), TP_ARGS (more flags
for the throughput table's --tp 2 runs, e.g. --sequence-parallel).
"""
import json, os, statistics, subprocess, sys, tempfile

PHALANX = sys.argv[1] if len(sys.argv) > 1 else "bin/phalanx"
WIDTH, DEPTH = os.environ.get("WIDTH", "256"), os.environ.get("DEPTH", "4")
HEADS, CONTEXT = os.environ.get("HEADS", "4"), os.environ.get("CONTEXT", "128")
BATCH = int(os.environ.get("BATCH", "8"))
STEPS = int(os.environ.get("STEPS", "30"))
WARMUP = int(os.environ.get("WARMUP", "5"))
REPS = int(os.environ.get("REPS", "2"))
CURVE_STEPS = int(os.environ.get("CURVE_STEPS", "200"))
TP_ARGS = os.environ.get("TP_ARGS", "").split()
ENV = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def run(args, model=None, steps=STEPS, batch=BATCH):
    """Runs one job; returns its events."""
    model = model or ["--width", WIDTH, "--depth", DEPTH, "--heads", HEADS, "--context", CONTEXT]
    with tempfile.TemporaryDirectory() as d:
        ev = os.path.join(d, "events.jsonl")
        cmd = [PHALANX, "train", "--example", "gpt", "--steps", str(steps), "--batch", str(batch), "--threads", "1",
               "--optimizer", "adam", "--lr", "0.002", "--warmup", "10", "--clip", "1", "--events", ev] + model + args
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=ENV)
        return [json.loads(l) for l in open(ev)]


def rate(events):
    """Median samples/s after the warm-up, and the collectives' share."""
    if not any(e["event"] == "pipeline_step" for e in events):  # a ring
        ring = [e for e in events if e["event"] == "step" and e["step"] > WARMUP]
        return statistics.median(e["samples_per_s"] for e in ring), 0.0
    last = max(e["stage"] for e in events if e["event"] == "pipeline_step")
    steps = [e for e in events if e["event"] == "pipeline_step" and e["step"] > WARMUP]
    ends = [e for e in steps if e["stage"] == last]
    share = statistics.median(e["wait_s"] / e["step_s"] for e in steps)
    return statistics.median(BATCH / e["step_s"] for e in ends), share


def curve(events):
    """The training loss by step (the last stage's, or the ring's)."""
    out = {}
    for e in events:
        if e["event"] in ("step", "pipeline_step") and "loss" in e:
            out[e["step"]] = e["loss"]
    return out


def done(events):
    return next(e for e in events if e["event"] == "done")


def main():
    only = os.environ.get("ONLY", "")
    if only not in ("", "throughput", "torch"):
        sys.exit("ONLY: throughput, torch, or nothing for every table")
    if only == "torch":
        return speed(statistics.median(rate(run(["--workers", "1"]))[0] for _ in range(REPS)))
    print("## throughput: --tp 2 against one worker (one core each)\n")
    ones, twos, shares = [], [], []
    for _ in range(REPS):
        ones.append(rate(run(["--workers", "1"]))[0])
        r, s = rate(run(["--tp", "2"] + TP_ARGS))
        twos.append(r)
        shares.append(s)
    print("| run | samples/s (each pair) | median |\n|---|---|---|")
    print(f"| --workers 1 | {', '.join(f'{x:.2f}' for x in ones)} | {statistics.median(ones):.2f} |")
    print(f"| --tp 2 | {', '.join(f'{x:.2f}' for x in twos)} | {statistics.median(twos):.2f} |")
    ratios = [b / a for a, b in zip(ones, twos)]
    print(f"\nratio (each pair): {', '.join(f'{x:.2f}' for x in ratios)}; median **{statistics.median(ratios):.2f}**; "
          f"tensor-parallel collectives' share of a rank's step: {statistics.median(shares):.1%}\n")
    if only:
        return

    print("## accuracy: the loss curve at --tp 2 against --tp 1\n")
    small = ["--width", "64", "--depth", "2", "--heads", "4", "--context", "64"]
    a = run(["--tp", "1"], model=small, steps=CURVE_STEPS, batch=16)
    b = run(["--tp", "2"], model=small, steps=CURVE_STEPS, batch=16)
    ca, cb = curve(a), curve(b)
    gaps = []
    for lo in range(1, CURVE_STEPS + 1, 10):
        ws = [s for s in range(lo, lo + 10) if s in ca and s in cb]
        if ws:
            ma, mb = statistics.mean(ca[s] for s in ws), statistics.mean(cb[s] for s in ws)
            gaps.append(abs(mb - ma) / ma)
    print(f"largest gap between the 10-step means: **{max(gaps):.2%}** over {len(gaps)} windows; "
          f"held-out loss --tp 1 {done(a)['loss']:.4f}, --tp 2 {done(b)['loss']:.4f} nats/char\n")

    speed(statistics.median(ones))


def speed(ours):
    """The model's own speed: one worker against PyTorch, ours measured
    earlier in the run and again after the reference."""
    print("## the model's own speed: one worker against PyTorch (one thread)\n")
    env = dict(ENV, WIDTH=WIDTH, DEPTH=DEPTH, HEADS=HEADS, CONTEXT=CONTEXT, BATCH=str(BATCH), STEPS=str(STEPS), WARMUP=str(WARMUP))
    torch = json.loads(subprocess.run(["/usr/bin/python3", os.path.join(os.path.dirname(__file__), "gpt_torch.py")],
                                      check=True, capture_output=True, text=True, env=env).stdout)
    ours_now = rate(run(["--workers", "1"]))[0]
    print(f"| | samples/s |\n|---|---|\n| phalanx --workers 1 | {ours_now:.2f} (earlier in the run: {ours:.2f}) |\n"
          f"| PyTorch {torch['torch']} | {torch['samples_per_s']:.2f} |\n\nratio **{ours_now / torch['samples_per_s']:.2f}**")


main()
