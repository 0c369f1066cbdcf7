package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
)

// trainCmd is phalanx train: a local job through phalanx.Launch.
func trainCmd(reg *phalanx.Registry, stdout, stderr io.Writer) *cobra.Command {
	cmd := leaf("train", "train a model on N local elastic workers (or parameter servers)",
		"Trains a model on --workers local elastic worker processes, like torchrun. Membership lives in etcd:\n"+
			"an embedded etcd server (data under --job-dir) unless --etcd-endpoints names a cluster; a coordinator\n"+
			"in this process decides the generations (rings). A worker that dies is removed and the others go on;\n"+
			"a worker sent SIGTERM leaves gracefully; workers started later (phalanx worker) join. SIGINT or\n"+
			"SIGTERM to this process, or Ctrl-C at its terminal (its workers never see it), stops the whole job\n"+
			"(after a final checkpoint when checkpointing, named once found complete in the store; exit 3).\n"+
			"A second signal ends the job at once (exit 1).\n"+
			"Shows progress (step, loss, samples/s, ETA) and membership changes, and ends with the held-out result.\n"+
			"A parameter-server model (sparse-lr) runs --ps-servers servers and --workers workers instead.")
	cmd.Example = examplesOf["train"]
	fs := cmd.Flags()
	var f configFlags
	f.register(fs, reg)
	lc := phalanx.DefaultLaunchConfig()
	fs.IntVar(&lc.Workers, "workers", lc.Workers, "worker processes to start, 1..64")
	fs.IntVar(&lc.MinWorkers, "min-workers", lc.MinWorkers, "fewest workers the job trains with")
	fs.IntVar(&lc.MaxWorkers, "max-workers", 0, "most workers admitted to a ring (default: --workers)")
	fs.DurationVar(&lc.MinWorkersTimeout, "min-workers-timeout", lc.MinWorkersTimeout, "stop the job when it stays below --min-workers this long")
	fs.DurationVar(&lc.JoinWindow, "join-window", lc.JoinWindow, "how long a newcomer waits so that newcomers arriving together enter one generation")
	eventsPath := fs.String("events", "", "append the job's events as JSON lines to this file; an earlier run's events stay before them (see docs/events.md)")
	fs.StringVar(&lc.JobDir, "job-dir", "", "the job's directory (embedded etcd data, and logs/ unless --log-dir); default: a temporary\none, removed when the job ends")
	fs.StringVar(&lc.LogDir, "log-dir", "", "where every process's log goes, kept after the job (default: the job directory's logs/,\nor with a temporary one $TMPDIR/phalanx-logs/JOB); named in the first lines")
	fs.IntVar(&lc.Threads, "threads", 0, "OS threads running Go code in each worker (GOMAXPROCS); 0 = cores/workers, at least 1,\nplus one with OpenBLAS (for communication while a matrix product runs in C)")
	fs.Int64Var(&lc.LogEvery, "log-every", 0, "steps between progress lines (0: twenty lines over the job)")
	fs.StringVar(&lc.LogLevel, "log-level", lc.LogLevel, "level of the library logs, written to --log-dir (debug: also to stderr, a line each, prefixed\nwith its process)")
	fs.StringVar(&lc.Metrics, "metrics", "", "serve the job's Prometheus metrics (docs/metrics.md), /healthz and /readyz at this address\n(host:port); each process serves its own on the next ports (port 0: ports they choose), named in the output")
	fs.StringVar(&lc.Status, "status", "", "serve the job's live status page at this address (host:port): the ring and its generations,\nthe workers, the loss curve, checkpoints and the last events")
	fs.StringVar(&lc.Trace, "trace", "", "write the job's timeline to this file (Chrome trace JSON, for Perfetto or chrome://tracing;\nit must not exist): every process's forward/backward, collectives, optimizer, checkpoints")
	tlsMode := fs.String("tls", "off", "auto: the job over mutual TLS with an ephemeral CA made at launch (a local job; plaintext is\n"+
		"refused on every plane); off: plaintext, unless --tls-ca, --tls-cert and --tls-key name the job's files")
	coordinate := fs.Bool("coordinator", true, "run a coordinator in this process (with an external etcd, others may run standbys: phalanx coordinator)")
	completeTraining(cmd, reg)
	completeLogLevel(cmd)
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		if err := f.apply(); err != nil {
			return err
		}
		lc.Config, lc.Registry, lc.NoCoordinator = f.cfg, reg, !*coordinate
		switch *tlsMode {
		case "auto":
			lc.TLSAuto = true
		case "off":
		default:
			return usagef("--tls %q: want auto or off", *tlsMode)
		}
		lc.Output, lc.Stderr = stdout, stderr
		if pl := lc.Pipeline; !fs.Changed("workers") && isPipeline(reg, &lc.Config) {
			lc.Workers = pl.Stages * pl.Replicas // a pipeline's processes
			if pl.Tensor > 0 {
				lc.Workers = pl.Tensor * pl.Replicas // a split model's
			}
		}
		if *eventsPath != "" {
			ev, err := os.OpenFile(*eventsPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				return fmt.Errorf("--events: %w", err)
			}
			defer ev.Close()
			lc.Events = events.New(ev, nil)
		}
		if lc.Job == "" {
			lc.Job = fmt.Sprintf("train-%d-%d", os.Getpid(), time.Now().Unix())
		}
		_, err := phalanx.Launch(ctx, lc)
		return asUsage(err)
	})
}

// workerCmd is phalanx worker: one worker of a job, through etcd.
func workerCmd(reg *phalanx.Registry, stdout, stderr io.Writer) *cobra.Command {
	cmd := leaf("worker", "one elastic worker of a job (joins through etcd)",
		"Runs one elastic worker of a job: it registers in etcd (--etcd-endpoints), trains in every generation\n"+
			"the coordinator puts it in, and survives the loss or arrival of other workers. Start one per host\n"+
			"or GPU slot with the same training flags; \"phalanx train\" starts them for you. SIGTERM makes it\n"+
			"leave the job gracefully (the others go on). Prints its progress in plain lines on stdout (rank 0\n"+
			"reports the job's steps), or with --json one JSON report per line (docs/events.md).")
	cmd.Example = examplesOf["worker"]
	fs := cmd.Flags()
	var f configFlags
	f.register(fs, reg)
	fs.StringVar(&f.cfg.Bind, "bind", f.cfg.Bind, "data-plane listen address (host:port; port 0 picks one; [::]:port for IPv6); the control plane\nlistens on the same host")
	fs.StringVar(&f.cfg.Advertise, "advertise", "", "the address other hosts reach this worker at (HOST, or HOST:PORT behind a proxy); needed when\n--bind listens on every interface (0.0.0.0 or [::])")
	fs.IntVar(&f.cfg.RankHint, "rank-hint", -1, "preferred place in the first ring (-1: none)")
	fs.IntVar(&f.cfg.Index, "worker-index", -1, "this worker's index (for --fail-at; a parameter-server worker's place, 0..workers-1)")
	fs.StringVar(&f.cfg.Metrics, "metrics", "", "serve this worker's Prometheus metrics (docs/metrics.md), /healthz and /readyz at this\naddress (host:port; port 0 picks one, named in the output)")
	threads := fs.Int("threads", 0, "OS threads running Go code (GOMAXPROCS); 0 = all cores")
	asJSON := fs.Bool("json", false, "print one JSON report per line on stdout instead of plain lines")
	every := fs.Int64("log-every", 0, "steps between progress lines (0: twenty lines over the job)")
	completeTraining(cmd, reg)
	return withLoggedRun(cmd, stderr, func(ctx context.Context, _ []string, log *zap.Logger) error {
		if err := f.apply(); err != nil {
			return err
		}
		setThreads(*threads)
		if *every < 0 {
			return usagef("--log-every %d: must not be negative", *every)
		}
		f.cfg.Logger, f.cfg.Reports = log, phalanx.ReportText(stdout, f.cfg.Steps, cmp.Or(*every, max(1, f.cfg.Steps/20)))
		if *asJSON {
			f.cfg.Reports = jsonLines(stdout)
		}
		_, err := phalanx.RunModel(ctx, f.cfg, reg)
		return asUsage(err)
	})
}

// isPipeline reports whether cfg's model is of the pipeline kind.
func isPipeline(reg *phalanx.Registry, cfg *phalanx.Config) bool {
	spec, err := reg.Lookup(cfg.Model)
	if err != nil {
		return false
	}
	k, err := reg.KindOf(spec, cfg)
	return err == nil && k.Name() == "pipeline"
}
