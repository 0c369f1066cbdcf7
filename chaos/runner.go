package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Runner runs scenarios: each run is the scenario's job launched through
// phalanx.Launch (real worker processes of this program, which must call
// phalanx.Main first thing), its faults injected as their triggers fire,
// and its invariants checked against an undisturbed run of the same job.
type Runner struct {
	// Registry resolves the job's model, here and in every worker.
	Registry *phalanx.Registry
	// Kinds are the fault kinds scenarios may name (default DefaultKinds).
	Kinds Kinds
	// Configure, if set, adjusts every launch after the scenario's job is
	// applied: an embedder's own model, options or data. Its ModelOptions
	// is never nil, and a copy: writing to it leaves the scenario as it was.
	Configure func(*phalanx.LaunchConfig)
	// Dir holds the runs' checkpoints and job directories (default: a new
	// temporary directory per run). A run whose invariants all hold is
	// removed; a failed one is kept and named in its report.
	Dir string
	// Output receives a line per run and per fault (nil: none).
	Output io.Writer
	Log    *zap.Logger
	Now    func() time.Time

	refs map[string]*Outcome // undisturbed runs, by job
}

// Event is one event of a job's log, as a launcher emitted it.
type Event struct {
	At     time.Time      `json:"-"`
	Kind   string         `json:"event"`
	Fields map[string]any `json:"fields"`
}

func (e Event) num(k string) int64 {
	switch v := e.Fields[k].(type) {
	case float64:
		return int64(v)
	case json.Number:
		n, _ := v.Int64()
		return n
	}
	return 0
}

// recorder is the events.Sink of a launch: it keeps every event and hands
// each to the run's scheduler.
type recorder struct {
	now func() time.Time
	mu  sync.Mutex
	all []Event
	ch  chan Event
}

func (r *recorder) Emit(kind string, fields ...events.Field) error {
	m := make(map[string]any, len(fields))
	for _, f := range fields {
		b, err := json.Marshal(f.Value)
		if err != nil {
			return fmt.Errorf("chaos: event %s.%s: %w", kind, f.Key, err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		m[f.Key] = v
	}
	e := Event{At: r.now(), Kind: kind, Fields: m}
	r.mu.Lock()
	r.all = append(r.all, e)
	r.mu.Unlock()
	r.ch <- e
	return nil
}

// Outcome is how one launch sequence of a job ended.
type Outcome struct {
	Err      error
	Result   *phalanx.Result
	Launches int
	Events   []Event
}

// Member is a rank of the ring as faults see it.
type Member struct {
	Rank     int
	ID       string
	Pid      int64
	DataAddr string
}

// Env is the running job as a fault sees it.
type Env struct {
	// Members is the ring when the fault fires, by rank; Rank the target.
	Members []Member
	Rank    int
	// Started are the pids of every worker process the current launch
	// started (in the ring or not yet).
	Started []int64
	// Store is the job's checkpoint store (nil without checkpoints).
	Store checkpoint.Store
	run   *run
}

func (e *Env) target() (Member, error) {
	if e.Rank < 0 || e.Rank >= len(e.Members) {
		return Member{}, fmt.Errorf("rank %d is not in the ring of %d", e.Rank, len(e.Members))
	}
	return e.Members[e.Rank], nil
}

// Relaunch asks the runner to launch the job again, on world workers (0:
// the scenario's number), once the current launch has ended.
func (e *Env) Relaunch(world int) {
	if world == 0 {
		world = e.run.sc.Job.Workers
	}
	e.run.relaunch = world
}

// Etcd is the job's records through a client of its etcd (nil before
// the job has started).
func (e *Env) Etcd(ctx context.Context) *coordinator.Job {
	e.run.ring(ctx, e.run.endpoint, nil) // connects the run's client
	if e.run.cli == nil {
		return nil
	}
	coord, _ := e.run.coord()
	return coord
}

// Damaged records checkpoint id as damaged on purpose: invariant 5 expects
// it not to verify.
func (e *Env) Damaged(id string) { e.run.damaged[id] = true }

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Runner) log() *zap.Logger {
	if r.Log != nil {
		return r.Log
	}
	return zap.NewNop()
}

func (r *Runner) kinds() Kinds {
	if r.Kinds != nil {
		return r.Kinds
	}
	return DefaultKinds()
}

func (r *Runner) say(format string, a ...any) {
	if r.Output != nil {
		fmt.Fprintf(r.Output, format+"\n", a...)
	}
}

// launchConfig is the scenario's job as a launch of workers workers, with
// its checkpoints in ckpt ("" : none) and its directory jobDir.
func (r *Runner) launchConfig(sc *Scenario, name string, workers int, ckpt, jobDir string, ev events.Sink, svcs ...Service) phalanx.LaunchConfig {
	j := sc.Job
	lc := phalanx.DefaultLaunchConfig()
	lc.Registry = r.Registry
	lc.Job = name
	lc.Model = j.Model
	if lc.Model == "" {
		lc.Model = "mlp"
	}
	// A fresh map: Configure may write to it (README: lc.ModelOptions["data"] = ...),
	// and must not write into the scenario's.
	lc.ModelOptions = make(map[string]string, len(j.Options))
	maps.Copy(lc.ModelOptions, j.Options)
	lc.Workers, lc.MaxWorkers = workers, max(workers, sc.Job.Workers)
	lc.MinWorkers = min(max(j.MinWorkers, 1), workers)
	lc.Steps = j.Steps
	if j.Batch > 0 {
		lc.Batch = j.Batch
	}
	if j.Seed > 0 {
		lc.Seed = j.Seed
	}
	switch j.Kind {
	case "hybrid":
		lc.Sync.Mode = "hybrid"
	case "ps":
		psConfigure(sc, &lc)
	}
	if p := j.Pipeline; p != nil {
		lc.Pipeline.Stages, lc.Pipeline.Replicas, lc.Pipeline.Tensor = p.Stages, max(p.Replicas, 1), p.Tensor
		if p.Schedule != "" {
			lc.Pipeline.Schedule = p.Schedule
		}
		if p.MicroBatches > 0 {
			lc.MicroBatches = p.MicroBatches
		}
		if p.CommitEvery > 0 {
			lc.CommitEvery = p.CommitEvery
		}
	}
	if j.LeaseTTL > 0 {
		lc.LeaseTTL = time.Duration(j.LeaseTTL)
	}
	if j.Network == "netns" {
		// Hosts apart talk TCP; the reference on loopback must sum the same way.
		lc.Transport = "tcp"
	}
	lc.Threads = 1
	// Info, not the default warn: a failed run's kept logs then say what
	// each worker decided and when (run56's stage-kill-alone left only
	// its warnings, and the cause of its slow recovery unproven).
	lc.LogLevel = "info"
	lc.JobDir = jobDir
	lc.Events = ev
	if ckpt != "" {
		lc.Checkpoint.Location = ckpt
		lc.Checkpoint.EverySteps = j.CheckpointEvery
		lc.Checkpoint.KeepLast = 0 // keep every checkpoint: invariant 5 checks them all
	}
	for _, s := range svcs {
		s.Configure(&lc)
	}
	if r.Configure != nil {
		r.Configure(&lc)
	}
	return lc
}

// jobKind checks a scenario whose job is of a kind the harness does not
// know against the registry (its model must be of that kind), and returns
// what that kind says its events leave unchecked.
func (r *Runner) jobKind(sc *Scenario) (map[int]string, any, error) {
	if builtinKind(sc.Job.Kind) {
		return nil, nil, nil
	}
	if r.Registry == nil {
		return nil, nil, fmt.Errorf("%w %q: job.kind %q needs the runner's Registry", ErrScenario, sc.Name, sc.Job.Kind)
	}
	spec, err := r.Registry.Lookup(sc.Job.Model)
	if err != nil {
		return nil, nil, fmt.Errorf("%w %q: %w", ErrScenario, sc.Name, err)
	}
	var cfg phalanx.Config
	if p := sc.Job.Pipeline; p != nil {
		cfg.Pipeline.Tensor = p.Tensor
	}
	k, err := r.Registry.KindOf(spec, &cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("%w %q: %w", ErrScenario, sc.Name, err)
	}
	if k.Name() != sc.Job.Kind {
		return nil, nil, fmt.Errorf("%w %q: job.kind %q, but model %s is of kind %q", ErrScenario, sc.Name, sc.Job.Kind, spec.Name, k.Name())
	}
	u, ok := k.(Unchecked)
	if !ok {
		return nil, k, nil
	}
	unchecked := u.Unchecked()
	for n := range unchecked {
		if n < 2 || n >= len(invariantNames) {
			return nil, nil, fmt.Errorf("%w %q: job kind %q leaves invariant %d unchecked: only 2 and later can be", ErrScenario, sc.Name, k.Name(), n)
		}
	}
	return unchecked, k, nil
}

// Reference runs the scenario's job once, undisturbed (remembered for the
// runner's later runs of the same job).
func (r *Runner) Reference(ctx context.Context, sc *Scenario) (*Outcome, error) {
	key, _ := json.Marshal(sc.Job)
	if o := r.refs[string(key)]; o != nil {
		return o, nil
	}
	dir, err := r.runDir("reference-" + sc.Name)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rec := &recorder{now: r.now, ch: make(chan Event, 1<<16)}
	go func() {
		for range rec.ch {
		}
	}()
	ckpt := ""
	if sc.Job.CheckpointEvery > 0 {
		ckpt = filepath.Join(dir, "checkpoints")
	}
	lc := r.launchConfig(sc, "chaos-ref-"+sc.Name, sc.Job.Workers, ckpt, filepath.Join(dir, "job"), rec)
	lc.Command = markCommand(lc.Command, dir)
	r.say("chaos: %s: the undisturbed reference run", sc.Name)
	res, err := phalanx.Launch(ctx, lc)
	close(rec.ch)
	if err != nil {
		return nil, fmt.Errorf("chaos: %s: the undisturbed reference run failed: %w", sc.Name, err)
	}
	o := &Outcome{Result: res, Launches: 1, Events: rec.all}
	if r.refs == nil {
		r.refs = map[string]*Outcome{}
	}
	r.refs[string(key)] = o
	return o, nil
}

func (r *Runner) runDir(name string) (string, error) {
	if r.Dir != "" {
		if err := os.MkdirAll(r.Dir, 0o755); err != nil {
			return "", fmt.Errorf("chaos: %w", err)
		}
	}
	d, err := os.MkdirTemp(r.Dir, "chaos-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	return d, nil
}

// run is one run's state, shared by its scheduler and the faults.
type run struct {
	unchecked map[int]string // the invariants the job's kind leaves unchecked
	kind      any            // the job's kind, when not a built-in one (CheckpointVerifier)
	r         *Runner
	sc        *Scenario
	plan      []Planned
	kinds     Kinds
	store     checkpoint.Store
	cli       *clientv3.Client
	job       string // the current launch's job name
	endpoint  string // its etcd
	services  []Service
	closed    bool // services closed
	relaunch  int
	damaged   map[string]bool
	faults    []*FaultRecord
	saved     map[string]uint32 // checkpoint id → its manifest's CRC32C, as its writer reported it
	pids      map[int64]bool
	addrs     map[string]bool
	start     time.Time
	marker    string // in every process of the run's launches (markEnv)
	shmDir    string // where the workers' shared-memory files are (default shmDir)
}

// Run runs the scenario once with seed and checks its invariants. The
// error is for a run that could not be carried out (a bad scenario, no
// reference); a job that breaks an invariant is a report whose Passed is
// false.
func (r *Runner) Run(ctx context.Context, sc Scenario, seed uint64) (*Report, error) {
	kinds := r.kinds()
	if err := sc.Validate(kinds); err != nil {
		return nil, err
	}
	unchecked, kind, err := r.jobKind(&sc)
	if err != nil {
		return nil, err
	}
	ref, err := r.Reference(ctx, &sc)
	if err != nil {
		return nil, err
	}
	dir, err := r.runDir(sc.Name)
	if err != nil {
		return nil, err
	}
	ru := &run{r: r, sc: &sc, plan: sc.Plan(seed), kinds: kinds, damaged: map[string]bool{}, saved: map[string]uint32{},
		pids: map[int64]bool{}, addrs: map[string]bool{}, start: r.now(), marker: dir, unchecked: unchecked, kind: kind}
	for _, p := range ru.plan {
		ru.faults = append(ru.faults, &FaultRecord{Planned: p, Changes: kinds[p.Kind].Changes})
	}
	if err := ru.startServices(ctx, dir); err != nil {
		return nil, err
	}
	defer ru.closeServices()
	ckpt := ""
	if sc.Job.CheckpointEvery > 0 {
		ckpt = filepath.Join(dir, "checkpoints")
		creds := checkpoint.Credentials{}
		for _, s := range ru.services {
			if st, ok := s.(storeService); ok {
				ckpt, creds = st.CheckpointLocation()
			}
		}
		if ru.store, err = checkpoint.OpenURL(ctx, ckpt, creds); err != nil {
			return nil, fmt.Errorf("chaos: the run's checkpoint store: %w", err)
		}
	}
	r.say("chaos: %s seed %d: %d faults planned", sc.Name, seed, len(ru.plan))
	out := &Outcome{}
	workers := sc.Job.Workers
	for attempt := 1; ; attempt++ {
		rec := &recorder{now: r.now, ch: make(chan Event, 1<<16)}
		name := fmt.Sprintf("chaos-%s-%d-%d", sc.Name, seed, attempt)
		lc := r.launchConfig(&sc, name, workers, ckpt, filepath.Join(dir, "job-"+strconv.Itoa(attempt)), rec, ru.services...)
		lc.Command = markCommand(lc.Command, ru.marker)
		ru.relaunch, ru.job = 0, name
		lctx, cancel := context.WithCancel(ctx)
		sched := make(chan struct{})
		go func() {
			defer close(sched)
			ru.schedule(lctx, rec.ch, attempt)
		}()
		res, err := phalanx.Launch(ctx, lc)
		close(rec.ch)
		<-sched
		cancel()
		if ru.cli != nil {
			ru.cli.Close()
			ru.cli = nil
		}
		out.Events = append(out.Events, rec.all...)
		out.Launches = attempt
		out.Result, out.Err = res, err
		if ru.relaunch == 0 || ctx.Err() != nil {
			break
		}
		r.say("chaos: %s seed %d: launch %d ended (%v); launching again on %d workers", sc.Name, seed, attempt, err, ru.relaunch)
		workers = ru.relaunch
	}
	rep := ru.check(ctx, out, ref, seed)
	rep.Dir = dir
	if rep.Passed {
		os.RemoveAll(dir)
		rep.Dir = ""
	}
	return rep, nil
}

// coord is the job's records through the run's client as it is now
// (ringClient replaces the client when it loses its member).
func (ru *run) coord() (*coordinator.Job, error) {
	keys, err := coordinator.KeysFor(ru.job)
	if err != nil {
		return nil, err
	}
	return coordinator.NewJob(ru.cli, keys), nil
}

// ring is the current ring with data-plane addresses from the job's etcd,
// or from the latest generation event when etcd cannot be read.
func (ru *run) ring(ctx context.Context, endpoint string, fallback []Member) []Member {
	out := append([]Member(nil), fallback...)
	if endpoint == "" {
		return out
	}
	if ru.cli == nil {
		cli, err := coordinator.Connect(strings.Split(endpoint, ","), nil, ru.r.log())
		if err != nil {
			return out
		}
		ru.cli = cli
	}
	coord, err := ru.coord()
	if err != nil {
		return out
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	g, _, err := coord.CurrentGeneration(cctx)
	if err != nil || g == nil {
		return out
	}
	ms := membersOf(g)
	for _, m := range ms {
		if m.DataAddr != "" {
			ru.addrs[m.DataAddr] = true
		}
	}
	return ms
}

func membersOf(g *phalanxpb.Generation) []Member {
	out := make([]Member, len(g.Members))
	for i, m := range g.Members {
		out[i] = Member{Rank: i, ID: m.Id, Pid: m.Pid, DataAddr: m.DataAddr}
	}
	return out
}
