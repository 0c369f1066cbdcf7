package phalanx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
)

// LaunchConfig is a local job: an embedded etcd server (unless Config.Etcd
// names a cluster), a coordinator, and Workers worker processes, each a
// re-execution of this program that Main turns into a worker.
type LaunchConfig struct {
	Config
	// Registry resolves Config.Model, here and in every worker process.
	Registry *Registry
	// Workers to start (1..64); the rings hold MinWorkers..MaxWorkers
	// (default 1 and Workers). A job below MinWorkers for
	// MinWorkersTimeout is stopped. JoinWindow: how long a newcomer waits,
	// so that newcomers arriving together enter one generation.
	Workers, MinWorkers, MaxWorkers int
	MinWorkersTimeout, JoinWindow   time.Duration
	// NoCoordinator: the job's coordinator runs elsewhere (phalanx
	// coordinator, with an external etcd).
	NoCoordinator bool
	// JobDir holds the embedded etcd's data (and the logs, unless LogDir
	// says otherwise); default: a temporary directory, removed when the
	// job ends.
	JobDir string
	// LogDir receives every process's log (launcher.log, worker-N.log,
	// ...), kept when the job ends and named in the job's first lines of
	// Output; default: JobDir/logs with a JobDir, else
	// <temporary directory>/phalanx-logs/<Job>.
	LogDir string
	// Threads: OS threads running Go code in each worker (GOMAXPROCS);
	// 0 shares the cores evenly.
	Threads int
	// LogLevel of the library logs (debug, info, warn, error): they go to
	// files under LogDir, and at debug to Stderr as well, each line
	// rendered for people and prefixed with its process ([worker-2]).
	LogLevel string
	// LogEvery: steps between progress lines (0: twenty over the job).
	LogEvery int64
	// Output receives the job's progress, in plain words (nil: none);
	// Stderr the debug logs. Events receives the job's event log.
	Output, Stderr io.Writer
	Events         events.Sink
	// Command makes the command of a worker process; its environment is
	// added to. Default: this program (os.Executable), which must call Main
	// first thing.
	Command func() (*exec.Cmd, error)
}

// DefaultLaunchConfig is a job of two workers on DefaultConfig.
func DefaultLaunchConfig() LaunchConfig {
	return LaunchConfig{Config: DefaultConfig(), Workers: 2, MinWorkers: 1, MinWorkersTimeout: time.Minute,
		JoinWindow: time.Second, LogLevel: "warn"}
}

// workerEnv carries a launched process's spec: its presence makes Main run
// the process as one of the job's.
const workerEnv = "PHALANX_WORKER"

// processSpec is what a launched process is told: its role, the job's
// configuration and its own place.
type processSpec struct {
	Role     string `json:"role"` // worker, ps-server or ps-worker
	Config   Config `json:"config"`
	Index    int    `json:"index"`
	RankHint int    `json:"rank_hint"`
	Threads  int    `json:"threads"`
	LogLevel string `json:"log_level"`
}

// validate checks the launch and fills in its defaults.
func (lc *LaunchConfig) validate() (ModelSpec, Options, error) {
	if lc.Registry == nil {
		return ModelSpec{}, nil, errors.New("phalanx: LaunchConfig.Registry is needed to resolve the model")
	}
	spec, opts, err := lc.Registry.check(&lc.Config)
	if err != nil {
		return spec, nil, err
	}
	if lc.MaxWorkers == 0 {
		lc.MaxWorkers = lc.Workers
	}
	if lc.LogLevel == "" {
		lc.LogLevel = "warn"
	}
	var lvl zapcore.Level
	switch {
	case lc.Workers < 1 || lc.Workers > 64:
		return spec, nil, bad("Workers", lc.Workers, "want 1..64")
	case lc.Threads < 0:
		return spec, nil, bad("Threads", lc.Threads, "must not be negative")
	case lc.LogEvery < 0:
		return spec, nil, bad("LogEvery", lc.LogEvery, "must not be negative")
	case lvl.UnmarshalText([]byte(lc.LogLevel)) != nil:
		return spec, nil, bad("LogLevel", lc.LogLevel, "want debug, info, warn or error")
	}
	if spec.PS != nil {
		return spec, opts, lc.Config.validatePS()
	}
	if err := lc.Config.Validate(); err != nil {
		return spec, nil, err
	}
	switch {
	case lc.MinWorkers < 1 || lc.MaxWorkers < lc.MinWorkers:
		return spec, nil, bad("MinWorkers", lc.MinWorkers, "want 1 <= MinWorkers <= MaxWorkers (%d)", lc.MaxWorkers)
	case lc.MinWorkersTimeout <= 0:
		return spec, nil, bad("MinWorkersTimeout", lc.MinWorkersTimeout, "must be positive")
	case lc.JoinWindow < 0:
		return spec, nil, bad("JoinWindow", lc.JoinWindow, "must not be negative")
	case lc.Faults.FailWorker >= lc.Workers:
		return spec, nil, bad("Faults.FailWorker", lc.Faults.FailWorker, "not below Workers %d", lc.Workers)
	}
	if lc.Rescale == "lr" && lc.ReferenceWorld == 0 {
		lc.ReferenceWorld = lc.Workers
	}
	return spec, opts, nil
}

// jobEnv is what a launcher runs a job in: the job's etcd (embedded or
// external), a client of it, its keys, its directory and logs.
type jobEnv struct {
	lc        *LaunchConfig
	endpoints []string
	cli       *clientv3.Client
	keys      coordinator.Keys
	dir       string
	log       *zap.Logger
	ev        events.Sink
	out       io.Writer
	procs     *launch.Group
	undo      []func()
	tempDir   bool
	logDir    string
	teeMu     sync.Mutex // the debug lines of every process, one at a time
}

// openJob starts the job's environment; close undoes it. What it starts
// lives in ctx; startup bounds the waits of the start itself (an
// operator's signal ends them).
func openJob(ctx, startup context.Context, lc *LaunchConfig) (_ *jobEnv, err error) {
	j := &jobEnv{lc: lc, ev: lc.Events, out: lc.Output, procs: launch.NewGroup()}
	if j.out == nil {
		j.out = io.Discard
	}
	if j.ev == nil {
		j.ev = (*events.Log)(nil)
	}
	defer func() {
		if err != nil {
			j.close(err)
		}
	}()
	if lc.Job == "" {
		lc.Job = fmt.Sprintf("job-%d-%d", os.Getpid(), time.Now().Unix())
	}
	if j.keys, err = coordinator.KeysFor(lc.Job); err != nil {
		return nil, bad("Job", lc.Job, "%v", err)
	}
	j.dir = lc.JobDir
	if j.dir == "" {
		if j.dir, err = os.MkdirTemp("", "phalanx-job-"); err != nil {
			return nil, err
		}
		j.tempDir = true
	}
	j.logDir = lc.LogDir
	switch {
	case j.logDir != "":
	case lc.JobDir != "":
		j.logDir = filepath.Join(lc.JobDir, "logs")
	default:
		j.logDir = filepath.Join(os.TempDir(), "phalanx-logs", lc.Job)
	}
	if err := os.MkdirAll(j.logDir, 0o755); err != nil {
		return nil, fmt.Errorf("phalanx: the log directory: %w", err)
	}
	fmt.Fprintf(j.out, "logs: %s\n", j.logDir)
	j.log = lc.Logger
	if j.log == nil {
		if j.log, err = j.fileLogger("launcher"); err != nil {
			return nil, err
		}
	}
	j.endpoints = lc.Etcd
	if len(j.endpoints) == 0 {
		e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: filepath.Join(j.dir, "etcd"), Logger: j.log.Named("etcd")})
		if err != nil {
			return nil, err
		}
		j.undo = append(j.undo, e.Close)
		j.endpoints = e.Endpoints()
	}
	if j.cli, err = coordinator.Dial(startup, j.endpoints, coordinator.DialOptions{Logger: j.log, Wait: lc.EtcdDialTimeout,
		Say: func(line string) { fmt.Fprintf(j.out, "phalanx: %s\n", line) }}); err != nil {
		return nil, err
	}
	j.undo = append(j.undo, func() { j.cli.Close() })
	return j, nil
}

// fileLogger logs at the launch's level to JobDir/logs/<name>.log, and at
// debug to Stderr as well.
func (j *jobEnv) fileLogger(name string) (*zap.Logger, error) {
	w, err := j.logFile(name)
	if err != nil {
		return nil, err
	}
	var lvl zapcore.Level
	lvl.UnmarshalText([]byte(j.lc.LogLevel))
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(w), lvl)), nil
}

// logFile is where a process's logs go.
func (j *jobEnv) logFile(name string) (io.Writer, error) {
	f, err := os.OpenFile(filepath.Join(j.logDir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("phalanx: a log file: %w", err)
	}
	j.undo = append(j.undo, func() { f.Close() })
	if j.lc.LogLevel == "debug" && j.lc.Stderr != nil {
		return io.MultiWriter(f, &teeLines{name: name, w: j.lc.Stderr, mu: &j.teeMu}), nil
	}
	return f, nil
}

// close kills what still runs and undoes the environment; a failed job
// (err) keeps its directory and says where its logs are.
func (j *jobEnv) close(err error) {
	j.procs.Kill()
	for i := len(j.undo) - 1; i >= 0; i-- {
		j.undo[i]()
	}
	if j.log != nil {
		j.log.Sync()
	}
	var stopped *StoppedError
	if failed := err != nil && !errors.As(err, &stopped); failed && j.logDir != "" {
		fmt.Fprintf(j.out, "the job's logs are in %s\n", j.logDir)
	}
	if j.tempDir { // its etcd data: the logs are elsewhere
		os.RemoveAll(j.dir)
	}
}

// spawn starts process index of role with spec.
func (j *jobEnv) spawn(ctx context.Context, spec processSpec) error {
	spec.LogLevel = j.lc.LogLevel
	spec.Config.Etcd, spec.Config.Job = j.endpoints, j.lc.Job
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	mk := j.lc.Command
	if mk == nil {
		mk = selfCommand
	}
	cmd, err := mk()
	if err != nil {
		return err
	}
	cmd.Env = append(append(append(os.Environ(), cmd.Env...), credentialsEnv(j.lc.Credentials)...), workerEnv+"="+string(b))
	name := fmt.Sprintf("%s-%d", spec.Role, spec.Index)
	if cmd.Stderr, err = j.logFile(name); err != nil {
		return err
	}
	p, err := j.procs.Start(cmd, spec.Role, spec.Index)
	if err != nil {
		return err
	}
	j.ev.Emit("worker_started", events.F("worker", spec.Index), events.F("pid", p.Pid()), events.F("role", spec.Role))
	return nil
}

// selfCommand re-executes this program.
func selfCommand() (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("phalanx: this program's path, to start workers: %w", err)
	}
	return exec.Command(exe), nil
}

// credentialsEnv hands explicit S3 credentials to workers in their
// environment: never on a command line, nor in the spec.
func credentialsEnv(c checkpoint.Credentials) []string {
	if c.AccessKey == "" && c.SecretKey == "" {
		return nil
	}
	env := []string{"AWS_ACCESS_KEY_ID=" + c.AccessKey, "AWS_SECRET_ACCESS_KEY=" + c.SecretKey}
	if c.SessionToken != "" {
		env = append(env, "AWS_SESSION_TOKEN="+c.SessionToken)
	}
	return env
}

// workerSpecEnv is the environment variable (name=value) that makes this
// program, started with it, one more worker of a running local job: the
// job_started event carries it, so that a test or an operator can add a
// worker by hand. index names the worker (for fault injection).
func workerSpecEnv(cfg Config, index int, logLevel string) string {
	b, _ := json.Marshal(processSpec{Role: "worker", Config: cfg, Index: index, RankHint: -1, LogLevel: logLevel})
	return workerEnv + "=" + string(b)
}

// openStore fails a launch before anything starts when its checkpoint
// store is unusable. It says first, on out, which store it opens: an S3
// endpoint named by default (s3.amazonaws.com) is then no surprise.
func openStore(ctx context.Context, c *Config, out io.Writer) (checkpoint.Store, error) {
	if c.Checkpoint.Location == "" {
		return nil, nil
	}
	l, err := checkpoint.ParseLocation(c.Checkpoint.Location)
	if err != nil {
		return nil, err
	}
	if out != nil {
		tls := ""
		if l.S3 != nil && l.S3.TLS {
			tls = " (TLS)"
		}
		fmt.Fprintf(out, "checkpoints: %s%s\n", l, tls)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	store, err := checkpoint.Open(sctx, l, c.Credentials)
	if err != nil {
		return nil, fmt.Errorf("phalanx: checkpoint store %s: %w", l, err)
	}
	return store, nil
}

func exitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// joinEndpoints is for messages.
func joinEndpoints(e []string) string { return strings.Join(e, ",") }
