package job

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

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/metrics"
	"github.com/phalanx-rt/phalanx/status"
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
	// 0 shares the cores evenly, and gives a ring or pipeline worker one
	// more when its matrix products run in C (launch.ComputeThreads).
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
	// PassStderr passes every process's stderr on to Stderr, each line
	// prefixed with its process ([worker-2]) and a log line rendered for
	// people: the library's logs at LogLevel and whatever the program
	// itself writes there (at debug, it always does). It is kept in the
	// log files all the same.
	PassStderr bool
	Events     events.Sink
	// Metrics: the launcher serves the job's Prometheus metrics
	// (docs/metrics.md), /healthz and /readyz here (host:port; port 0
	// picks one; "": none): its own and every process's, which each serve
	// their own on the same host, on the following ports (port 0: on
	// ports of their own choosing), and tell the launcher.
	Metrics string
	// Status: the launcher serves the job's live status page here
	// (host:port; "": none); its processes then serve their metrics too,
	// for the page's per-worker figures. Either way the launcher publishes
	// the job's status in its etcd every few seconds, for phalanx status.
	Status string
	// Trace: write the job's timeline to this file (Chrome trace JSON,
	// which Perfetto and chrome://tracing open; it must not exist): each
	// process records its spans in a file of its own under Trace.parts/,
	// merged into Trace as the job ends, the processes' clocks aligned.
	Trace string
	// TLSAuto runs the job over mutual TLS with an ephemeral CA: a CA and
	// one certificate of the job for this host, made at launch in a
	// directory of the job's (removed at its end) and handed to every
	// process as Config.TLS. For a local job on its embedded etcd; Config.TLS
	// must be empty.
	TLSAuto bool
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

// WorkerEnv carries a launched process's spec: its presence makes Main run
// the process as one of the job's.
const WorkerEnv = "PHALANX_WORKER"

// ProcessSpec is what a launched process is told: its role, the job's
// configuration and its own place.
type ProcessSpec struct {
	Role     string `json:"role"` // worker, ps-server or ps-worker
	Config   Config `json:"config"`
	Index    int    `json:"index"`
	RankHint int    `json:"rank_hint"`
	Threads  int    `json:"threads"`
	LogLevel string `json:"log_level"`
	// Metrics is where the process serves its metrics (Config.Metrics).
	Metrics string `json:"metrics,omitempty"`
	// Trace is the file the process records its spans in (Config.Tracer).
	Trace string `json:"trace,omitempty"`
}

// Launch runs a local job to its end: the job's etcd (embedded unless
// Config.Etcd names a cluster), and the processes its kind starts
// (re-executions of this program, which must call Main first thing). A
// ring model trains data-parallel over elastic workers; a parameter-server
// model over PSConfig.Servers servers and Workers workers. Progress goes to
// Output, events to Events. Cancelling ctx stops the job: with
// checkpoints, at the next step boundary after a final one (a
// *StoppedError: the same launch resumes), otherwise at once.
func Launch(ctx context.Context, lc LaunchConfig) (*Result, error) {
	p, err := Prepare(ctx, lc)
	if err != nil {
		return nil, err
	}
	return p.Run(ctx)
}

// Prepared is a launch checked before anything starts (Prepare), ready to
// run.
type Prepared struct {
	lc  LaunchConfig
	job Job
}

// Prepare checks a launch, as Launch does first: a bad one is refused
// before anything starts.
func Prepare(ctx context.Context, lc LaunchConfig) (*Prepared, error) {
	j, err := lc.prepare(ctx)
	if err != nil {
		return nil, err
	}
	return &Prepared{lc: lc, job: j}, nil
}

// Run runs a prepared launch to its end (see Launch); once.
func (p *Prepared) Run(ctx context.Context) (*Result, error) {
	// The caller's ctx ending does not end the job's own: with checkpoints
	// it first asks the workers for a final one.
	jctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	env, err := OpenEnv(jctx, ctx, &p.lc)
	if err != nil {
		return nil, err
	}
	res, err := p.job.Run(ctx, jctx, cancel, env)
	env.Close(err)
	return res, err
}

// prepare checks the launch, fills in its defaults and finds its model and
// kind; the kind checks what is its own and prepares the job.
func (lc *LaunchConfig) prepare(ctx context.Context) (Job, error) {
	if lc.Registry == nil {
		return nil, errors.New("phalanx: LaunchConfig.Registry is needed to resolve the model")
	}
	spec, opts, err := lc.Registry.Check(&lc.Config)
	if err != nil {
		return nil, err
	}
	kind, err := lc.Registry.KindOf(spec, &lc.Config)
	if err != nil {
		return nil, err
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
		return nil, Invalid("Workers", lc.Workers, "want 1..64")
	case lc.Threads < 0:
		return nil, Invalid("Threads", lc.Threads, "must not be negative")
	case lc.LogEvery < 0:
		return nil, Invalid("LogEvery", lc.LogEvery, "must not be negative")
	case lvl.UnmarshalText([]byte(lc.LogLevel)) != nil:
		return nil, Invalid("LogLevel", lc.LogLevel, "want debug, info, warn or error")
	}
	for _, a := range []struct{ field, addr string }{{"Metrics", lc.Metrics}, {"Status", lc.Status}, {"Config.Metrics", lc.Config.Metrics}} {
		if err := checkListen(a.addr); err != nil {
			return nil, Invalid(a.field, a.addr, "%v", err)
		}
	}
	if err := checkTrace(lc.Trace); err != nil {
		return nil, Invalid("Trace", lc.Trace, "%v", err)
	}
	switch {
	case lc.TLSAuto && lc.TLS.Enabled():
		return nil, Invalid("TLSAuto", lc.TLSAuto, "makes the job's TLS material: name no TLS files with it")
	case lc.TLSAuto && len(lc.Etcd) > 0:
		return nil, Invalid("TLSAuto", lc.TLSAuto, "makes a CA for a local job, which an external etcd (Etcd) does not trust: give the job's TLS files instead")
	}
	if _, err := LoadSecurity(&lc.Config); err != nil {
		return nil, err
	}
	return kind.Prepare(ctx, lc, spec, opts)
}

// Env is what a launcher runs a job in: the job's etcd (embedded or
// external), the job's records in it (Coord), its directory and logs.
type Env struct {
	LC        *LaunchConfig
	Endpoints []string
	Coord     *coordinator.Job // a client of the job's etcd and the job's keys
	Dir       string           // the job's directory: its embedded etcd's data
	LogDir    string           // every process's log
	Log       *zap.Logger      // the launcher's
	Events    events.Sink      // never nil
	Out       io.Writer        // progress in plain words; never nil
	Procs     *launch.Group
	// Sec is the job's mutual TLS (nil: plaintext), LC.TLS loaded: the
	// embedded etcd's, the launcher's etcd client's and its probes'.
	Sec *Security
	// Metrics are the launcher's own (from the job's events); Scraper
	// gathers its processes' for the job's one endpoint.
	Metrics    *metrics.Set
	Scraper    *metrics.Scraper
	Status     *status.Model
	metricsAt  string // the launcher's metrics address, once served
	statusAt   string // its status page's
	traceParts string // the processes' trace files' directory ("": no trace)
	hangs      *hangWatch
	spawned    int // processes started, for their metrics ports
	undo       []func()
	tempDir    bool
	teeMu      sync.Mutex // the debug lines of every process, one at a time
}

// OpenEnv starts the job's environment; close undoes it. What it starts
// lives in ctx; startup bounds the waits of the start itself (an
// operator's signal ends them).
func OpenEnv(ctx, startup context.Context, lc *LaunchConfig) (_ *Env, err error) {
	j := &Env{LC: lc, Events: lc.Events, Out: lc.Output, Procs: launch.NewGroup()}
	if j.Out == nil {
		j.Out = io.Discard
	}
	j.Out = &lockedWriter{w: j.Out} // the kind's lines, and the processes' readers' (tap)
	if j.Events == nil {
		j.Events = (*events.Log)(nil)
	}
	defer func() {
		if err != nil {
			j.Close(err)
		}
	}()
	if lc.Job == "" {
		lc.Job = fmt.Sprintf("job-%d-%d", os.Getpid(), time.Now().Unix())
	}
	keys, err := coordinator.KeysFor(lc.Job)
	if err != nil {
		return nil, Invalid("Job", lc.Job, "%v", err)
	}
	j.Dir = lc.JobDir
	if j.Dir == "" {
		if j.Dir, err = os.MkdirTemp("", "phalanx-job-"); err != nil {
			return nil, err
		}
		j.tempDir = true
	}
	j.LogDir = lc.LogDir
	switch {
	case j.LogDir != "":
	case lc.JobDir != "":
		j.LogDir = filepath.Join(lc.JobDir, "logs")
	default:
		j.LogDir = filepath.Join(os.TempDir(), "phalanx-logs", lc.Job)
	}
	if err := os.MkdirAll(j.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("phalanx: the log directory: %w", err)
	}
	fmt.Fprintf(j.Out, "logs: %s\n", j.LogDir)
	j.Log = lc.Logger
	if j.Log == nil {
		if j.Log, err = j.FileLogger("launcher"); err != nil {
			return nil, err
		}
	}
	if err := j.serveMetrics(); err != nil {
		return nil, err
	}
	if err := j.startTrace(); err != nil {
		return nil, err
	}
	if lc.TLSAuto && !lc.TLS.Enabled() {
		f, remove, err := ephemeralTLS(j.Dir, lc.Job, time.Now())
		if err != nil {
			return nil, err
		}
		j.undo = append(j.undo, remove)
		lc.TLS = f
	}
	if j.Sec, err = LoadSecurity(&lc.Config); err != nil {
		return nil, err
	}
	j.Endpoints = lc.Etcd
	if len(j.Endpoints) == 0 {
		e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: filepath.Join(j.Dir, "etcd"), Logger: j.Log.Named("etcd"),
			TLS: lc.TLS, Jobs: []string{lc.Job}})
		if err != nil {
			return nil, err
		}
		j.undo = append(j.undo, e.Close)
		j.Endpoints = e.Endpoints()
	}
	cli, err := coordinator.Dial(startup, j.Endpoints, coordinator.DialOptions{Logger: j.Log, Wait: lc.EtcdDialTimeout, TLS: j.Sec.Client(),
		Say: func(line string) { fmt.Fprintf(j.Out, "phalanx: %s\n", line) }})
	if err != nil {
		return nil, err
	}
	j.Coord = coordinator.NewJob(cli, keys)
	j.undo = append(j.undo, func() { cli.Close() })
	j.follow(ctx)
	return j, nil
}

// FileLogger logs at the launch's level to JobDir/logs/<name>.log, and at
// debug to Stderr as well.
func (j *Env) FileLogger(name string) (*zap.Logger, error) {
	w, err := j.LogFile(name)
	if err != nil {
		return nil, err
	}
	var lvl zapcore.Level
	lvl.UnmarshalText([]byte(j.LC.LogLevel))
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(w), lvl)), nil
}

// LogFile is where a process's logs go.
func (j *Env) LogFile(name string) (io.Writer, error) {
	f, err := os.OpenFile(filepath.Join(j.LogDir, name+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("phalanx: a log file: %w", err)
	}
	j.undo = append(j.undo, func() { f.Close() })
	if (j.LC.LogLevel == "debug" || j.LC.PassStderr) && j.LC.Stderr != nil {
		return io.MultiWriter(f, &teeLines{name: name, w: j.LC.Stderr, mu: &j.teeMu}), nil
	}
	return f, nil
}

// close kills what still runs and undoes the environment; a failed job
// (err) keeps its directory and says where its logs are.
func (j *Env) Close(err error) {
	j.Procs.Kill()
	if j.hangs != nil {
		j.hangs.flush()
	}
	j.mergeTrace()
	if j.Status != nil && err != nil {
		var stopped *StoppedError
		if !errors.As(err, &stopped) {
			j.Status.Emit("job_failed", events.F("error", err.Error()))
		}
	}
	for i := len(j.undo) - 1; i >= 0; i-- {
		j.undo[i]()
	}
	if j.Log != nil {
		j.Log.Sync()
	}
	var stopped *StoppedError
	if failed := err != nil && !errors.As(err, &stopped); failed && j.LogDir != "" {
		fmt.Fprintf(j.Out, "the job's logs are in %s\n", j.LogDir)
	}
	if j.tempDir { // its etcd data: the logs are elsewhere
		os.RemoveAll(j.Dir)
	}
}

// StartWorkers starts the job's Workers processes of role, worker i with
// rank hint i and threads threads, and says so in the job_started event:
// the job, its etcd, the workers, the model, the environment a process
// started by hand joins with (worker_env), and the kind's own fields
// (more).
func (j *Env) StartWorkers(ctx context.Context, role string, threads int, more ...events.Field) error {
	lc := j.LC
	for i := range lc.Workers {
		if err := j.Spawn(ctx, ProcessSpec{Role: role, Config: lc.Config, Index: i, RankHint: i, Threads: threads}); err != nil {
			return err
		}
	}
	spec := lc.Config
	spec.Etcd, spec.Job = j.Endpoints, lc.Job
	f := []events.Field{events.F("job", lc.Job), events.F("etcd_endpoints", JoinEndpoints(j.Endpoints)),
		events.F("workers", lc.Workers), events.F("model", lc.Model), events.F("worker_env", WorkerSpecEnv(role, spec, lc.Workers, lc.LogLevel))}
	j.Events.Emit("job_started", append(f, more...)...)
	return nil
}

// spawn starts process index of role with spec.
func (j *Env) Spawn(ctx context.Context, spec ProcessSpec) error {
	spec.LogLevel = j.LC.LogLevel
	spec.Config.Etcd, spec.Config.Job, spec.Config.TLS = j.Endpoints, j.LC.Job, j.LC.TLS
	spec.Metrics = j.processMetrics()
	if j.traceParts != "" {
		spec.Trace = filepath.Join(j.traceParts, fmt.Sprintf("%s-%d.jsonl", spec.Role, spec.Index))
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	mk := j.LC.Command
	if mk == nil {
		mk = SelfCommand
	}
	cmd, err := mk()
	if err != nil {
		return err
	}
	cmd.Env = append(append(append(os.Environ(), cmd.Env...), credentialsEnv(j.LC.Credentials)...), WorkerEnv+"="+string(b))
	name := fmt.Sprintf("%s-%d", spec.Role, spec.Index)
	if cmd.Stderr, err = j.LogFile(name); err != nil {
		return err
	}
	p, err := j.Procs.Start(cmd, spec.Role, spec.Index)
	if err != nil {
		return err
	}
	j.Events.Emit("worker_started", events.F("worker", spec.Index), events.F("pid", p.Pid()), events.F("role", spec.Role))
	return nil
}

// SelfCommand re-executes this program.
func SelfCommand() (*exec.Cmd, error) {
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

// WorkerSpecEnv is the environment variable (name=value) that makes this
// program, started with it, one more worker of a running local job: the
// job_started event carries it, so that a test or an operator can add a
// worker by hand. role is the kind's worker role; index names the
// worker (for fault injection).
func WorkerSpecEnv(role string, cfg Config, index int, logLevel string) string {
	b, _ := json.Marshal(ProcessSpec{Role: role, Config: cfg, Index: index, RankHint: -1, LogLevel: logLevel})
	return WorkerEnv + "=" + string(b)
}

// OpenStore fails a launch before anything starts when its checkpoint
// store is unusable. It says first, on out, which store it opens: an S3
// endpoint named by default (s3.amazonaws.com) is then no surprise.
func OpenStore(ctx context.Context, c *Config, out io.Writer) (checkpoint.Store, error) {
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

func ExitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// JoinEndpoints is for messages.
func JoinEndpoints(e []string) string { return strings.Join(e, ",") }

// AskStop asks the workers, once the caller's context (outer) ended, to
// stop at the next step boundary after a final checkpoint; it returns a
// channel that fires when they should be killed if they have not. A job
// without checkpoints ends at once (the caller's cause).
func (j *Env) AskStop(outer, ctx context.Context) (<-chan time.Time, error) {
	lc := j.LC
	if lc.Checkpoint.Location == "" {
		return nil, context.Cause(outer)
	}
	fmt.Fprintln(j.Out, "stopping: the workers take a final checkpoint at the next step boundary")
	j.Events.Emit("stopping", events.F("reason", context.Cause(outer).Error()))
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	err := j.Coord.RequestStop(sctx, context.Cause(outer).Error())
	scancel()
	if err != nil {
		return nil, fmt.Errorf("asked to stop, and could not tell the workers: %w", err)
	}
	return time.After(lc.Checkpoint.Wait + time.Minute), nil
}

// lockedWriter writes for several goroutines, one write at a time.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
