#!/usr/bin/env python3
"""The pipeline figures of the README's "Pipelines in one page": one run,
ratios against references measured in the same run.

  python3 bench/pp_figures.py [PHALANX_BINARY]        (default: bin/phalanx)

Every process is limited to one core (--threads 1). Tables, in markdown:
  1. throughput: --pp 2 --micro-batches 8 (1f1b) against one process
     training the same model on the whole global batch at once (--pp 1
     --micro-batches 1), A B A B, samples/s from the wall time between the
     last stage's steps (median, warm-up steps skipped);
  2. bubble: each schedule at P = 2 and 4, m = 8: the pipeline's idle
     fraction, 1 − Σ busy / (P · the longest stage window), against
     the schedule's formula;
  3. memory: each stage's parameters and optimizer slots against the whole
     model's / P; the peak of in-flight micro-batches against the bound;
     --pp-recompute's activation bytes and step time;
  4. recovery: SIGKILL of a stage, to the first step of the next
     generation: dp2×pp2 (the other replica goes on), pp2 alone (the
     replacement restored from the neighbour's copy).
Environment: TP_BATCH (the throughput runs' global batch, default 1024),
DEPTH, WIDTH (the throughput model, default 16 × 1024; the
memory table also runs DEPTH + 1, whose square layers cut evenly),
BUBBLE_DEPTH, BUBBLE_WIDTH (the bubble model, default 9 × 512), STEPS
(default 14), REPS (pairs, default 2), COMMIT (the throughput runs'
--commit-every, default 10), RECOVERY_REPS (default 3), ONLY (one table:
throughput, bubbles, memory or recoveries).
"""
import json, os, signal, statistics, subprocess, sys, tempfile, time

PHALANX = sys.argv[1] if len(sys.argv) > 1 else "bin/phalanx"
DEPTH = int(os.environ.get("DEPTH", "16"))
WIDTH = int(os.environ.get("WIDTH", "1024"))
STEPS = int(os.environ.get("STEPS", "14"))
REPS = int(os.environ.get("REPS", "2"))
RECOVERY_REPS = int(os.environ.get("RECOVERY_REPS", "3"))
COMMIT = os.environ.get("COMMIT", "10")  # --commit-every of the throughput runs (a lone pipeline copies its commits to the next stage)
TP_BATCH = int(os.environ.get("TP_BATCH", "1024"))
BUBBLE_DEPTH = int(os.environ.get("BUBBLE_DEPTH", "9"))
BUBBLE_WIDTH = int(os.environ.get("BUBBLE_WIDTH", "512"))
WARM = 4  # steps skipped as warm-up


def run(args, kill=None):
    """Runs phalanx train with args; returns its events. kill(events, proc)
    is polled while it runs (for the recovery runs)."""
    with tempfile.TemporaryDirectory() as d:
        ev = os.path.join(d, "events.jsonl")
        cmd = [PHALANX, "train", "--example", "deep-mlp", "--threads", "1", "--events", ev, "--log-every", "100000"] + args
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        state = {}
        while p.poll() is None:
            if kill is not None:
                kill(read(ev), p, state)
            time.sleep(0.005)
        out = p.stdout.read().decode()
        if p.returncode != 0:
            sys.exit("phalanx %s failed:\n%s" % (" ".join(args), out[-3000:]))
        return read(ev), state


def read(path):
    evs = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    evs.append(json.loads(line))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return evs


def steps(evs, stage=None):
    return [e for e in evs if e["event"] == "pipeline_step" and (stage is None or e["stage"] == stage)]


def rate(evs, batch):
    last = max(e["stage"] for e in steps(evs))
    ts = [e["ts"] for e in steps(evs, last) if e["step"] > WARM]
    dts = [b - a for a, b in zip(ts, ts[1:])]
    return batch / statistics.median(dts)


def bubble_formula(kind, p, m, v=2):
    if kind == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if kind == "zb-h1":
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (m + p - 1)


def model(depth, width, batch=256):
    return ["--depth", str(depth), "--width", str(width), "--features", "256", "--samples", "16384", "--batch", str(batch)]


def throughput():
    """--pp 2 --micro-batches 8 against the best one process can do with
    the same model and global batch: the whole batch at once (--pp 1
    --micro-batches 1). Micro-batches of 32 rows (batch 256) make each
    layer's weight gradient a rank-32 update read and written 8 times a
    step, which a single process need not pay, so the batch is a
    parameter (TP_BATCH, default 1024: micro-batches of 128 rows); the
    single process with the pipeline's micro-batches is shown too."""
    batch = TP_BATCH
    base = model(DEPTH, WIDTH, batch) + ["--steps", str(STEPS), "--commit-every", COMMIT]
    one, two, one_m = [], [], []
    for _ in range(REPS):
        one.append(rate(run(base + ["--pp", "1", "--micro-batches", "1"])[0], batch))
        two.append(rate(run(base + ["--pp", "2", "--micro-batches", "8", "--pp-schedule", "1f1b"])[0], batch))
    one_m.append(rate(run(base + ["--pp", "1", "--micro-batches", "8"])[0], batch))
    ratios = [b / a for a, b in zip(one, two)]
    ideal = 2 * (1 - bubble_formula("1f1b", 2, 8))
    # The machine's own ceiling: two one-process jobs at once, each on a
    # core, against one alone (shared caches, memory and the host's cores).
    import threading
    both = [0, 0]
    def alone(i):
        both[i] = rate(run(base + ["--pp", "1", "--micro-batches", "1"])[0], batch)
    ts = [threading.Thread(target=alone, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    scaling = sum(both) / statistics.median(one)
    print("## Throughput: deep-mlp %d × %d, batch %d, --commit-every %s, one core per process\n" % (DEPTH, WIDTH, batch, COMMIT))
    print("| run | --pp 1 (whole batch) samples/s | --pp 2 --micro-batches 8 samples/s | ratio |")
    print("|---|---|---|---|")
    for i, (a, b) in enumerate(zip(one, two)):
        print("| %d | %.0f | %.0f | %.2f |" % (i + 1, a, b, b / a))
    print("\nmedian ratio **%.2f** (target ≥ 1.5; ideal 2·(1 − bubble) = %.2f); one process with 8 micro-batches: %.0f samples/s"
          % (statistics.median(ratios), ideal, one_m[0]))
    print("\ntwo --pp 1 jobs at once: %.0f and %.0f samples/s, together %.2f× one alone: the machine's ceiling for two\n"
          "single-threaded processes; times (1 − bubble): %.2f\n" % (both[0], both[1], scaling, scaling * (1 - bubble_formula("1f1b", 2, 8))))


def bubbles():
    """The formula is an idle fraction of the whole pipeline over one flush:
    1 − Σ busy / (P · makespan). Each stage's own window, from its step's
    start to its reduction, is shorter on the later stages (they finish
    before stage 0's last backward), so the mean of the stages' own idle
    fractions (pipeline_step's bubble) is also given."""
    print("## Bubble: deep-mlp %d × %d (%d layers of %d × %d and two small ones: cut evenly at P = 2 and 4), batch 256, m = 8\n"
          % (BUBBLE_DEPTH, BUBBLE_WIDTH, BUBBLE_DEPTH - 1, BUBBLE_WIDTH, BUBBLE_WIDTH))
    print("| P | schedule | measured: 1 − Σ busy / (P · longest stage window) | formula | difference | mean of stages' own idle | per stage: idle (waiting for a tensor, sending) |")
    print("|---|---|---|---|---|---|---|")
    for p in (2, 4):
        for kind in ("gpipe", "1f1b", "interleaved", "zb-h1"):
            evs, _ = run(model(BUBBLE_DEPTH, BUBBLE_WIDTH) + ["--steps", "14", "--micro-batches", "8", "--pp", str(p), "--pp-schedule", kind])
            by = {}
            for e in steps(evs):
                if e["step"] > WARM:
                    by.setdefault(e["step"], {})[e["stage"]] = e
            glob, own, per = [], [], {}
            for st, es in by.items():
                if len(es) != p:
                    continue
                busy = [e["busy"] * e["step_s"] for e in es.values()]
                sched = [b / (1 - es[s]["bubble"]) if es[s]["bubble"] < 1 else 0 for s, b in zip(es, busy)]
                glob.append(1 - sum(busy) / (p * max(sched)))
                own.append(statistics.mean(e["bubble"] for e in es.values()))
                for s, e in es.items():
                    sc = e["busy"] * e["step_s"] / max(1 - e["bubble"], 1e-9)
                    per.setdefault(s, []).append((e["bubble"], e["wait_s"] / sc, e["send_s"] / sc))
            g, f = statistics.median(glob), bubble_formula(kind, p, 8)
            stages = "; ".join("%.3f (%.3f, %.3f)" % tuple(statistics.median(x[i] for x in per[s]) for i in range(3)) for s in sorted(per))
            print("| %d | %s | %.3f | %.3f | %+.3f | %.3f | %s |" % (p, kind, g, f, g - f, statistics.median(own), stages))
    print("\nP = 4 puts four single-threaded stages on two cores: they time-share, so idle time is partly another stage's compute.\n")


def memory():
    for depth in (DEPTH, DEPTH + 1):
        print("## Memory: deep-mlp %d × %d (%d layers of %d × %d), 1f1b, m = 8 (each stage's own accounting)\n"
              % (depth, WIDTH, depth - 1, WIDTH, WIDTH))
        whole = None
        rows = []
        for p in (1, 2, 4):
            evs, _ = run(model(depth, WIDTH) + ["--steps", "6", "--micro-batches", "8", "--pp", str(p)])
            per = {}
            for e in steps(evs):
                per[e["stage"]] = (e["param_bytes"] + e["slot_bytes"], e["peak_activations"], e["activation_bytes"])
            if p == 1:
                whole = per[0][0]
            for s in sorted(per):
                rows.append((p, s, per[s][0], per[s][0] / (whole / p), per[s][1], min(p - s, 8), per[s][2]))
        print("| P | stage | params + slots | over whole/P | peak in flight | bound min(P−s, m) | activation bytes |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print("| %d | %d | %.1f MiB | %.3f | %d | %d | %.1f MiB |" % (r[0], r[1], r[2] / 2**20, r[3], r[4], r[5], r[6] / 2**20))
        print()
    print("| --pp 2 | stage 0 activation bytes | stage 1 activation bytes | median step s |")
    print("|---|---|---|---|")
    for extra in ([], ["--pp-recompute"]):
        evs, _ = run(model(DEPTH, WIDTH) + ["--steps", "10", "--micro-batches", "8", "--pp", "2"] + extra)
        act = {e["stage"]: e["activation_bytes"] for e in steps(evs)}
        ts = [e["ts"] for e in steps(evs, 1) if e["step"] > WARM]
        dt = statistics.median(b - a for a, b in zip(ts, ts[1:]))
        print("| %s | %.1f MiB | %.1f MiB | %.3f |" % ("recompute" if extra else "keep activations", act[0] / 2**20, act[1] / 2**20, dt))
    print()


def recovery(name, args, victim):
    def kill(evs, p, st):
        if "at" in st:
            return
        pids = {e["worker"]: e["pid"] for e in evs if e["event"] == "worker_started"}
        if victim in pids and any(e["event"] == "pipeline_step" and e["step"] >= 30 for e in evs):
            st["gen"] = max(e["generation"] for e in steps(evs))
            st["last"] = max(e["step"] for e in steps(evs))
            st["at"] = time.time()
            os.kill(pids[victim], signal.SIGKILL)
    out = []
    for _ in range(RECOVERY_REPS):
        evs, st = run(args, kill)
        after = [e for e in steps(evs) if e["generation"] > st["gen"]]
        first = min(after, key=lambda e: e["ts"])
        redone = [e.get("steps_redone") for e in evs if e["event"] == "stage_restored"]
        out.append((first["ts"] - st["at"], st["last"], first["step"], redone[:1]))
    print("| %s | %s | %.3f |" % (name, "; ".join("%.3fs (last step %d, next %d, redone %s)" % o for o in out), statistics.median(o[0] for o in out)))


def recoveries():
    print("## Recovery: SIGKILL of a stage to the first step of the next generation\n")
    print("| job | runs | median s |")
    print("|---|---|---|")
    small = ["--depth", "4", "--width", "64", "--features", "64", "--samples", "4096", "--batch", "64", "--steps", "3000", "--micro-batches", "4"]
    recovery("dp2×pp2, kill replica 1's stage 1 (target ≤ 1 s)", small + ["--dp", "2", "--pp", "2"], 3)
    recovery("pp2 alone, kill stage 1, --commit-every 5 (target ≤ 2 s)", small + ["--pp", "2", "--commit-every", "5"], 1)
    print()


if __name__ == "__main__":
    print("machine: %d cores, %s; phalanx %s\n" % (os.cpu_count(), subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(), PHALANX))
    for f in (throughput, bubbles, memory, recoveries):
        if os.environ.get("ONLY", f.__name__) == f.__name__:
            f()
            sys.stdout.flush()
