package job

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/pki"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/status"
)

// CoordinatorConfig configures a standalone coordinator of a job (Launch
// runs one of its own): it campaigns in an etcd election and, while it
// leads, decides the job's generations. Run several for standbys. Job,
// MinWorkers and MaxWorkers are required, and Etcd or JobDir; every other
// field has a default, named with it, that its zero value takes.
type CoordinatorConfig struct {
	Job string
	// Etcd lists the job's etcd endpoints; none: an embedded etcd server
	// with its data under JobDir/etcd.
	Etcd   []string
	JobDir string
	// ID names this coordinator in the election (default host-pid).
	ID string
	// MinWorkers..MaxWorkers is what a ring may hold (1 <= MinWorkers <=
	// MaxWorkers).
	MinWorkers, MaxWorkers int
	// Workers is how many workers the operator starts (0: not said). The
	// first ring waits until that many are live, or MinWorkersTimeout has
	// passed since the first registered, then takes whoever is live; 0
	// forms it with the first to register, and the rest join a generation
	// later.
	Workers int
	// MinWorkersTimeout: a job below MinWorkers this long is stopped
	// (default 60s). JoinWindow: how long a newcomer waits, so that
	// newcomers arriving together enter one generation (default 1s).
	MinWorkersTimeout, JoinWindow time.Duration
	LeaseTTL                      time.Duration // the leadership lease: a standby takes over within it (default 5s)
	EtcdDialTimeout               time.Duration // how long to wait for etcd's first answer (default 30s)
	// TLS is the job's mutual TLS (Config.TLS): etcd over TLS (the
	// embedded server too: clients and peers must present the job's
	// certificates), and the probes of workers' data planes.
	TLS    pki.Files
	Logger *zap.Logger // default: none
	// OnEndpoints, when set, is told the etcd endpoints once they serve.
	OnEndpoints func([]string)
}

// RunCoordinator runs a coordinator until the job is done or ctx ends.
func RunCoordinator(ctx context.Context, cfg CoordinatorConfig) error {
	switch {
	case cfg.Job == "":
		return Invalid("Job", "", "name the job")
	case cfg.MinWorkers < 1 || cfg.MaxWorkers < cfg.MinWorkers:
		return Invalid("MinWorkers", cfg.MinWorkers, "want 1 <= MinWorkers <= MaxWorkers (%d)", cfg.MaxWorkers)
	case cfg.Workers != 0 && (cfg.Workers < cfg.MinWorkers || cfg.Workers > cfg.MaxWorkers):
		return Invalid("Workers", cfg.Workers, "want 0 (not said) or MinWorkers..MaxWorkers (%d..%d)", cfg.MinWorkers, cfg.MaxWorkers)
	case cfg.MinWorkersTimeout < 0:
		return Invalid("MinWorkersTimeout", cfg.MinWorkersTimeout, "must not be negative (0: 60s)")
	case len(cfg.Etcd) == 0 && cfg.JobDir == "":
		return Invalid("Etcd", cfg.Etcd, "give the endpoints, or a JobDir for an embedded etcd")
	}
	sec, err := LoadSecurity(&Config{Job: cfg.Job, TLS: cfg.TLS})
	if err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	keys, err := coordinator.KeysFor(cfg.Job)
	if err != nil {
		return Invalid("Job", cfg.Job, "%v", err)
	}
	endpoints := cfg.Etcd
	if len(endpoints) == 0 {
		e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: filepath.Join(cfg.JobDir, "etcd"), Logger: log,
			TLS: cfg.TLS, Jobs: []string{cfg.Job}})
		if err != nil {
			return err
		}
		defer e.Close()
		endpoints = e.Endpoints()
	}
	if cfg.OnEndpoints != nil {
		cfg.OnEndpoints(endpoints)
	}
	cli, err := coordinator.Dial(ctx, endpoints, coordinator.DialOptions{Logger: log, Wait: cfg.EtcdDialTimeout, TLS: sec.Client()})
	if err != nil {
		return err
	}
	defer cli.Close()
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	c, err := coordinator.New(coordinator.NewJob(cli, keys), coordinator.Config{ID: cfg.ID, Rendezvous: coordinator.Rendezvous{MinWorkers: cfg.MinWorkers, MaxWorkers: cfg.MaxWorkers},
		JoinWindow: cfg.JoinWindow, MinWorkersTimeout: cfg.MinWorkersTimeout, SessionTTL: cfg.LeaseTTL, Logger: log,
		FirstRing: cfg.Workers, FirstRingWait: cmp.Or(cfg.MinWorkersTimeout, time.Minute), Probe: probeWorker(sec)})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// probeWorker is a coordinator's check of a reported loss: the worker's
// data-plane transport must answer (collective.Probe, over the job's TLS
// when it has one), which a killed process cannot, even while its
// listener still takes connections.
func probeWorker(sec *Security) func(ctx context.Context, r *phalanxpb.Registration) error {
	client := sec.Client()
	return func(ctx context.Context, r *phalanxpb.Registration) error {
		return collective.Probe(ctx, r.DataAddr, client)
	}
}

// Access is how a tool reaches a running job's records: its etcd
// endpoints, its name, and its TLS files when its etcd requires them.
type Access struct {
	Etcd []string
	Job  string
	TLS  pki.Files
}

// Stop asks every worker of a running job to stop at the next step
// boundary after a final checkpoint (a job without checkpoints ignores
// it). Each worker then ends with a *StoppedError; the same configuration
// resumes the job.
func Stop(ctx context.Context, a Access, reason string) error {
	j, done, err := connectJob(a)
	if err != nil {
		return err
	}
	defer done()
	return j.RequestStop(ctx, reason)
}

// connectJob is a client of the job's records in etcd; done closes it.
func connectJob(a Access) (j *coordinator.Job, done func(), err error) {
	keys, err := coordinator.KeysFor(a.Job)
	if err != nil {
		return nil, nil, Invalid("Job", a.Job, "%v", err)
	}
	sec, err := LoadSecurity(&Config{Job: a.Job, TLS: a.TLS})
	if err != nil {
		return nil, nil, err
	}
	cli, err := coordinator.Connect(a.Etcd, sec.Client(), nil)
	if err != nil {
		return nil, nil, err
	}
	return coordinator.NewJob(cli, keys), func() { cli.Close() }, nil
}

// JobStatus reads a running job's status from its etcd (status.Fetch):
// what its launcher published last, or its ring.
func JobStatus(ctx context.Context, a Access) (status.Snapshot, error) {
	j, done, err := connectJob(a)
	if err != nil {
		return status.Snapshot{}, err
	}
	defer done()
	s, err := status.Fetch(ctx, j)
	if errors.Is(err, status.ErrNoJob) {
		return s, fmt.Errorf("job %q at %s: %w", a.Job, JoinEndpoints(a.Etcd), err)
	}
	return s, err
}

// ServeStatus serves the status page of a job started elsewhere on addr,
// read from the job's etcd every second, until ctx ends; onServing is
// told the address served.
func ServeStatus(ctx context.Context, a Access, addr string, onServing func(addr string)) error {
	j, done, err := connectJob(a)
	if err != nil {
		return err
	}
	defer done()
	src, err := status.Follow(ctx, j, time.Second)
	if errors.Is(err, status.ErrNoJob) {
		return fmt.Errorf("job %q at %s: %w", a.Job, JoinEndpoints(a.Etcd), err)
	}
	if err != nil {
		return err
	}
	srv, err := status.Serve(addr, src)
	if err != nil {
		return err
	}
	if onServing != nil {
		onServing(srv.Addr())
	}
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Close(cctx)
}
