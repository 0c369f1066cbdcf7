package phalanx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Main makes this process a worker of a job when a launcher started it as
// one (Launch re-executes the program with the job's spec in its
// environment): it runs the worker with the models of reg and exits with
// its status. Otherwise it returns at once. Call it first in main, before
// anything else reads flags or starts work:
//
//	func main() {
//		reg := phalanx.NewRegistry(myModel())
//		phalanx.Main(reg)
//		... // the program itself, which may call phalanx.Launch
//	}
//
// In the worker, SIGTERM or SIGINT makes it leave the job gracefully (the
// others go on); a second one ends it at once.
func Main(reg *Registry) {
	raw, ok := os.LookupEnv(workerEnv)
	if !ok {
		return
	}
	os.Unsetenv(workerEnv) // not inherited by what the worker starts
	os.Exit(runProcess(raw, reg, os.Stdout, os.Stderr))
}

// BindEnv and AdvertiseEnv, in a launched process's environment, set its
// data-plane listen address and the address its peers dial (a worker in a
// network namespace of its own, behind a proxy: see chaos); by default it
// listens on a loopback port and advertises that.
const (
	BindEnv      = "PHALANX_BIND"
	AdvertiseEnv = "PHALANX_ADVERTISE"
)

// runProcess runs a launched process from its spec and returns its exit
// status: 0 done (or left on request), 4 stopped with the job, 1 failed, 2
// a spec it cannot read.
func runProcess(raw string, reg *Registry, stdout, stderr io.Writer) int {
	var spec processSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(stderr, "phalanx: %s is not a process spec: %v\n", workerEnv, err)
		return 2
	}
	log, err := processLogger(spec.LogLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "phalanx:", err)
		return 2
	}
	defer log.Sync()
	if spec.Threads > 0 {
		runtime.GOMAXPROCS(spec.Threads)
	}
	ctx, stop := signalContext()
	defer stop()
	cfg := spec.Config
	cfg.Index, cfg.RankHint, cfg.Logger, cfg.Bind = spec.Index, spec.RankHint, log, "127.0.0.1:0"
	if b := os.Getenv(BindEnv); b != "" {
		cfg.Bind = b
	}
	cfg.Advertise = os.Getenv(AdvertiseEnv)
	reports := ReportLines(stdout)
	cfg.Reports = reports
	switch spec.Role {
	case "worker":
		_, err = RunModel(ctx, cfg, reg)
	case "ps-server":
		err = RunPSServer(ctx, cfg, fmt.Sprintf("ps-%d", spec.Index), nil)
	case "ps-worker":
		_, err = runPSWorkerProcess(ctx, cfg, reg, spec.Index)
	case "etcd-member", "coordinator":
		err = runServiceProcess(ctx, raw, log, stdout)
	default:
		err = fmt.Errorf("phalanx: unknown process role %q", spec.Role)
	}
	return exitStatus(err, log, reports)
}

// exitStatus maps a process's end to its status, telling the launcher the
// reason of a failure in a last report.
func exitStatus(err error, log *zap.Logger, reports func(Report)) int {
	var stopped *StoppedError
	switch {
	case err == nil || errors.Is(err, ErrLeft):
		return 0
	case errors.As(err, &stopped):
		return exitStopped
	}
	log.Error("the worker failed", zap.Error(err))
	rep := Report{Kind: "failed", Reason: err.Error()}
	errors.As(err, &rep.NonFinite)
	reports(rep)
	return 1
}

// signalContext ends at the first SIGTERM or SIGINT; a second ends the
// process.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			cancel(fmt.Errorf("signal %v", s))
		case <-done:
			return
		}
		select {
		case <-sigs:
			os.Exit(1)
		case <-done:
		}
	}()
	return ctx, func() { signal.Stop(sigs); close(done); cancel(nil) }
}

// processLogger writes JSON logs at level to w (a launched process's
// stderr, which its launcher keeps in a file).
func processLogger(level string, w io.Writer) (*zap.Logger, error) {
	if level == "" {
		level = "warn"
	}
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, bad("LogLevel", level, "want debug, info, warn or error")
	}
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(w), lvl)), nil
}

// RunModel runs one worker of a job whose model is a registered one: a
// ring worker (RunWorker with the model's task) or a parameter-server
// worker (cfg.Index names it).
func RunModel(ctx context.Context, cfg Config, reg *Registry) (*Result, error) {
	spec, opts, err := reg.check(&cfg)
	if err != nil {
		return nil, err
	}
	if spec.PS != nil {
		return runPSWorkerProcess(ctx, cfg, reg, cfg.Index)
	}
	task, err := spec.New(opts, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("phalanx: building model %s: %w", spec.Name, err)
	}
	return RunWorker(ctx, cfg, task)
}
