package job

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

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/procenv"
	"github.com/phalanx-rt/phalanx/metrics"
	"github.com/phalanx-rt/phalanx/trace"
)

// Service runs a launched process that is not one of a job's kinds' (an
// etcd member, a standalone coordinator) from its raw spec.
type Service func(ctx context.Context, raw string, log *zap.Logger, stdout io.Writer) error

// RunProcess runs a launched process from its spec, its role one of reg's
// kinds' or of services, and returns its exit status: 0 done (or left on
// request), 4 stopped with the job, 1 failed, 2 a spec it cannot read.
func RunProcess(raw string, reg *Registry, services map[string]Service, stdout, stderr io.Writer) int {
	var spec ProcessSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(stderr, "phalanx: %s is not a process spec: %v\n", WorkerEnv, err)
		return 2
	}
	log, err := ProcessLogger(spec.LogLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "phalanx:", err)
		return 2
	}
	defer log.Sync()
	if spec.Threads > 0 {
		runtime.GOMAXPROCS(spec.Threads)
	}
	ctx, stop := SignalContext()
	defer stop()
	cfg := spec.Config
	cfg.Index, cfg.RankHint, cfg.Logger, cfg.Bind = spec.Index, spec.RankHint, log, "127.0.0.1:0"
	if b := os.Getenv(procenv.Bind); b != "" {
		cfg.Bind = b
	}
	cfg.Advertise = os.Getenv(procenv.Advertise)
	reports := ReportLines(stdout)
	cfg.Reports = reports
	cfg.Metrics = spec.Metrics
	if role, ok := reg.Role(spec.Role); ok {
		var stopMetrics func()
		if stopMetrics, err = StartMetrics(&cfg, spec.Role, metricsKind(spec.Role)); err != nil {
			return exitStatus(err, log, reports)
		}
		defer stopMetrics()
		if spec.Trace != "" {
			if cfg.Tracer, err = trace.Create(spec.Trace, fmt.Sprintf("%s-%d", spec.Role, spec.Index)); err != nil {
				return exitStatus(err, log, reports)
			}
			defer cfg.Tracer.Close()
		}
		_, err = role(ctx, cfg, reg)
	} else if svc, ok := services[spec.Role]; ok {
		err = svc(ctx, raw, log, stdout)
	} else {
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
		return ExitStopped
	}
	log.Error("the worker failed", zap.Error(err))
	rep := Failed{Reason: err.Error()}
	errors.As(err, &rep.NonFinite)
	reports(rep)
	return 1
}

// SignalContext ends at the first SIGTERM or SIGINT; a second ends the
// process.
func SignalContext() (context.Context, func()) {
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

// ProcessLogger writes JSON logs at level to w (a launched process's
// stderr, which its launcher keeps in a file).
func ProcessLogger(level string, w io.Writer) (*zap.Logger, error) {
	if level == "" {
		level = "warn"
	}
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, Invalid("LogLevel", level, "want debug, info, warn or error")
	}
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(w), lvl)), nil
}

// RunModel runs one worker of a job whose model is a registered one, in
// its kind's worker role (a ring worker, a parameter-server worker...).
func RunModel(ctx context.Context, cfg Config, reg *Registry) (*Result, error) {
	spec, _, err := reg.Check(&cfg)
	if err != nil {
		return nil, err
	}
	kind, err := reg.KindOf(spec, &cfg)
	if err != nil {
		return nil, err
	}
	stop, err := StartMetrics(&cfg, kind.Worker(), metricsKind(kind.Worker()))
	if err != nil {
		return nil, err
	}
	defer stop()
	return kind.Roles()[kind.Worker()](ctx, cfg, reg)
}

// DataPlane is a worker's data plane: its TCP listener, the transport
// over it (with shared memory beside it where Config.Transport allows),
// and the host identity that says which peers share this host's memory
// ("" with TCP alone).
type DataPlane struct {
	TCP       *collective.TCPTransport
	Transport collective.Transport
	HostID    string
}

// OpenDataPlane listens on c.Bind for c.Job's data plane, over mutual TLS
// when c.TLS names files (shared memory needs none: it never leaves the
// host, and its files are 0600); Close the TCP listener when done.
func OpenDataPlane(c *Config, log *zap.Logger) (*DataPlane, error) {
	kind, err := collective.ParseTransportKind(string(c.Transport))
	if err != nil {
		return nil, Invalid("Transport", c.Transport, "%v", err)
	}
	sec, err := LoadSecurity(c)
	if err != nil {
		return nil, err
	}
	tr, err := collective.ListenTCP(collective.TCPOptions{Bind: c.Bind, Advertise: c.Advertise, Job: c.Job, Logger: log, TLS: sec.Transport()})
	if err != nil {
		return nil, err
	}
	d := &DataPlane{TCP: tr}
	if d.Transport, err = collective.NewTransport(kind, tr, collective.ShmOptions{Logger: log}); err == nil && kind != collective.TransportTCP {
		d.HostID, err = collective.HostIdentity()
	}
	if err != nil {
		tr.Close()
		return nil, fmt.Errorf("phalanx: data plane: %w", err)
	}
	return d, nil
}

// metricsKind is the metrics a process of role has.
func metricsKind(role string) metrics.Process {
	switch role {
	case "ps-server":
		return metrics.PSServer
	case "ps-worker":
		return metrics.PSWorker
	}
	return metrics.Worker
}
