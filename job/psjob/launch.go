package psjob

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
	"github.com/phalanx-rt/phalanx/ps/cluster"
)

// validate checks a parameter-server job's configuration.
func validate(c *job.Config) error {
	if err := c.ValidateCommon(); err != nil {
		return err
	}
	p := c.PS
	switch {
	case p.Servers < 1 || p.Servers > 64:
		return job.Invalid("PS.Servers", p.Servers, "want 1..64")
	case p.Shards < 0 || p.Shards > 4096:
		return job.Invalid("PS.Shards", p.Shards, "want 1..4096, or 0 for one per server")
	case p.Replicas >= p.Servers:
		return job.Invalid("PS.Replicas", p.Replicas, "a shard's copies need as many servers; want below PS.Servers %d", p.Servers)
	case p.CacheRows < 0:
		return job.Invalid("PS.CacheRows", p.CacheRows, "must not be negative")
	case p.CacheStaleness < 0:
		return job.Invalid("PS.CacheStaleness", p.CacheStaleness, "must not be negative")
	case p.ReportEvery < 0:
		return job.Invalid("PS.ReportEvery", p.ReportEvery, "must not be negative")
	case c.Checkpoint.Every != 0:
		return job.Invalid("Checkpoint.Every", c.Checkpoint.Every, "a parameter-server job checkpoints by steps (Checkpoint.EverySteps) and at the end")
	case c.Batch < 1:
		return job.Invalid("Batch", c.Batch, "want at least 1")
	}
	if _, err := ps.ParseMode(psMode(string(c.Sync.Mode))); err != nil {
		return job.Invalid("Sync.Mode", c.Sync.Mode, "want bsp, asp (async), ssp or hybrid for a parameter-server job")
	}
	return nil
}

func psMode(m string) string {
	if m == "async" {
		return "asp"
	}
	return m
}

// psJobRecord is the job record a parameter-server launch writes in etcd
// for its servers and workers.
func psJobRecord(lc *job.LaunchConfig, spec job.ModelSpec, opts job.Options) (*phalanxpb.PSJob, error) {
	c, p := &lc.Config, lc.PS
	if p.Shards == 0 {
		p.Shards = p.Servers
	}
	if p.Replicas < 0 {
		p.Replicas = min(1, p.Servers-1)
	}
	if c.Batch < lc.Workers {
		return nil, job.Invalid("Batch", c.Batch, "each of the %d workers needs at least one example per step", lc.Workers)
	}
	batch := c.Batch / lc.Workers
	steps, err := spec.PS.Steps(opts, lc.Workers, batch)
	if err != nil {
		return nil, fmt.Errorf("phalanx: model %s: %w", spec.Name, err)
	}
	tables, err := spec.PS.Tables(opts, p.Optimizer, float32(p.LR))
	if err != nil {
		return nil, fmt.Errorf("phalanx: model %s: %w", spec.Name, err)
	}
	deadline := c.Sync.Deadline
	if deadline == 0 {
		deadline = 200 * time.Millisecond // parameter servers have no adaptive deadline
	}
	var decay float32
	if c.Sync.Stale == "decay" {
		decay = float32(c.Sync.StaleDecay)
	}
	j := &phalanxpb.PSJob{Shards: uint32(p.Shards), Replicas: uint32(p.Replicas), Partition: p.Partition, Servers: uint32(p.Servers),
		Workers: uint32(lc.Workers), Consistency: psMode(string(c.Sync.Mode)), CacheRows: uint32(p.CacheRows), CacheStaleness: p.CacheStaleness,
		Staleness: int32(c.Sync.Staleness), Quorum: c.Sync.Quorum, DeadlineNanos: int64(deadline), Decay: decay, Tables: tables,
		Model: spec.Name, Options: opts, Seed: c.Seed, Batch: uint32(batch), Steps: steps, ReportEvery: uint32(p.ReportEvery)}
	if _, err := cluster.SpecOf(j); err != nil {
		return nil, job.Invalid("PS", p.Partition, "%v", err)
	}
	return j, nil
}

// Kind is the parameter-server job: a model's tables sharded over
// PSConfig.Servers server processes (replicated, with failover), and
// Workers worker processes that push gradients and pull parameters, each
// training its share of the data (a dead worker's share is taken over).
type Kind struct{}

// Name is "ps".
func (Kind) Name() string { return "ps" }

// Owns a model with PS.
func (Kind) Owns(spec job.ModelSpec, _ *job.Config) bool { return spec.PS != nil }

// Worker is the role of a parameter-server worker.
func (Kind) Worker() string { return "ps-worker" }

// Roles are the servers and the workers.
func (Kind) Roles() map[string]job.Role {
	return map[string]job.Role{
		"ps-server": func(ctx context.Context, cfg job.Config, _ *job.Registry) (*job.Result, error) {
			return nil, RunServer(ctx, cfg, fmt.Sprintf("ps-%d", cfg.Index), nil)
		},
		"ps-worker": func(ctx context.Context, cfg job.Config, reg *job.Registry) (*job.Result, error) {
			return runPSWorkerProcess(ctx, cfg, reg, cfg.Index)
		},
	}
}

// Prepare checks a parameter-server launch and makes its job record.
func (Kind) Prepare(_ context.Context, lc *job.LaunchConfig, spec job.ModelSpec, opts job.Options) (job.Job, error) {
	if err := validate(&lc.Config); err != nil {
		return nil, err
	}
	rec, err := psJobRecord(lc, spec, opts)
	if err != nil {
		return nil, err
	}
	return prepared{rec}, nil
}

// prepared is a checked parameter-server launch: its job record.
type prepared struct{ rec *phalanxpb.PSJob }

// Run runs the job: etcd, the shard-map writer, the server processes and
// the worker processes, until every worker is done. The caller's context
// ending ends it at once.
func (p prepared) Run(outer, _ context.Context, _ context.CancelFunc, env *job.Env) (*job.Result, error) {
	ctx, cancel := context.WithCancel(outer)
	defer cancel()
	return (&psLaunch{Env: env, rec: p.rec, now: time.Now, types: reportTypes()}).run(ctx, cancel)
}

type psLaunch struct {
	*job.Env
	rec *phalanxpb.PSJob
	// now is the launcher's clock: the job's start, its progress lines'
	// ETA and its duration.
	now   func() time.Time
	types job.ReportTypes // what its workers report
}

// psRun is what a running job's event loop reads and keeps.
type psRun struct {
	maps    <-chan *phalanxpb.ShardMap // the shard-map writer's maps
	mapDone <-chan error               // the writer's end; nil once it ended
	lines   <-chan launch.Line         // the processes' stdout lines
	exits   <-chan launch.Exit         // and their exits
	start   time.Time
	running int   // workers not yet exited
	done    *Done // the job's end (ps_done)
	// failed is the first worker's failure: the job's, if no worker is
	// left to finish it; failures the reasons workers reported.
	failed   error
	failures map[int]string
}

// restore points the job at the newest checkpoint that verifies, if any.
func (p *psLaunch) restore(ctx context.Context) error {
	c := &p.LC.Config
	store, err := job.OpenStore(ctx, c, p.LC.Output)
	if store == nil || err != nil {
		return err
	}
	p.rec.Checkpoint, p.rec.CheckpointEvery = c.Checkpoint.Location, uint64(max(c.Checkpoint.EverySteps, 0))
	m, _, err := cluster.Latest(ctx, store)
	switch {
	case errors.Is(err, checkpoint.ErrNoCheckpoint):
		if c.Checkpoint.Resume {
			return fmt.Errorf("phalanx: Checkpoint.Resume: %s holds no parameter-server checkpoint", store.Location())
		}
		return nil
	case err != nil:
		return fmt.Errorf("phalanx: checkpoint store: %w (nothing was overwritten; remove the broken checkpoints with phalanx ckpt rm, or use another store)", err)
	}
	if m.Step > p.rec.Steps {
		return fmt.Errorf("phalanx: the newest checkpoint is of step %d, beyond the job's %d steps (fewer epochs or examples than it was trained with?)", m.Step, p.rec.Steps)
	}
	p.rec.RestoreFrom, p.rec.RestoreStep = cluster.Prefix(m.Step), m.Step
	p.Events.Emit("restored", events.F("step", m.Step), events.F("from_shards", m.Shards), events.F("shards", p.rec.Shards), events.F("checkpoint", p.rec.RestoreFrom))
	fmt.Fprintf(p.Out, "resuming from the checkpoint of step %d (%d shards) in %s, into %d shards\n", m.Step, m.Shards, store.Location(), p.rec.Shards)
	return nil
}

func (p *psLaunch) run(ctx context.Context, cancel context.CancelFunc) (*job.Result, error) {
	lc := p.LC
	if err := p.restore(ctx); err != nil {
		return nil, err
	}
	if err := cluster.WriteJob(ctx, p.Coord, p.rec); err != nil {
		return nil, err
	}
	s := &psRun{lines: p.Procs.Lines(), exits: p.Procs.Exits(), running: lc.Workers, failures: map[int]string{}}
	s.maps, s.mapDone = p.writeShardMaps(ctx)
	defer func() { // the shard map's writer ends before the client and etcd close
		cancel()
		if s.mapDone != nil {
			<-s.mapDone
		}
	}()
	if err := p.startProcesses(ctx); err != nil {
		return nil, err
	}
	p.announce()
	s.start = p.now()
	if err := p.loop(ctx, s); err != nil {
		return nil, err
	}
	p.drain(s)
	done, err := s.end()
	if err != nil {
		return nil, err
	}
	p.reportDone(done, p.pushAccounts(ctx, done.Steps), s.start)
	return &job.Result{Step: done.Steps, World: lc.Workers, Metrics: done.Metrics}, nil
}

// writeShardMaps runs the shard map's writer until ctx ends: maps delivers
// each new map, mapDone the writer's end.
func (p *psLaunch) writeShardMaps(ctx context.Context) (<-chan *phalanxpb.ShardMap, <-chan error) {
	lc, rec := p.LC, p.rec
	maps := make(chan *phalanxpb.ShardMap, 16)
	mapDone := make(chan error, 1)
	host, _ := os.Hostname()
	go func() {
		mapDone <- p.Coord.RunShardMap(ctx, coordinator.ShardMapConfig{ID: fmt.Sprintf("%s-%d", host, os.Getpid()),
			Shards: int(rec.Shards), Replicas: int(rec.Replicas), Servers: int(rec.Servers), SessionTTL: lc.LeaseTTL,
			Logger: p.Log.Named("shardmap"), OnMap: func(m *phalanxpb.ShardMap) {
				select {
				case maps <- m:
				case <-ctx.Done():
				}
			}})
	}()
	return maps, mapDone
}

// startProcesses clears the shares' claims of an earlier run and starts
// the servers, then the workers.
func (p *psLaunch) startProcesses(ctx context.Context) error {
	lc, rec := p.LC, p.rec
	if err := p.Coord.ClearPSShares(ctx); err != nil {
		return err
	}
	for i := range int(rec.Servers) {
		if err := p.Spawn(ctx, job.ProcessSpec{Role: "ps-server", Config: lc.Config, Index: i}); err != nil {
			return err
		}
	}
	threads := launch.ThreadsPerRank(lc.Threads, lc.Workers+int(rec.Servers))
	for i := range lc.Workers {
		if err := p.Spawn(ctx, job.ProcessSpec{Role: "ps-worker", Config: lc.Config, Index: i, Threads: threads}); err != nil {
			return err
		}
	}
	return nil
}

// announce tells of the started job: job_started and a line of Output.
func (p *psLaunch) announce() {
	lc, rec := p.LC, p.rec
	p.Events.Emit("job_started", events.F("job", lc.Job), events.F("etcd_endpoints", job.JoinEndpoints(p.Endpoints)),
		events.F("workers", lc.Workers), events.F("ps_servers", rec.Servers), events.F("ps_shards", rec.Shards), events.F("ps_replicas", rec.Replicas),
		events.F("consistency", rec.Consistency), events.F("model", rec.Model))
	fmt.Fprintf(p.Out, "phalanx: %s on %d workers and %d parameter servers (%d shards, %d backups each, %s, %s); job %s, etcd %s\n",
		rec.Model, lc.Workers, rec.Servers, rec.Shards, rec.Replicas, rec.Partition, rec.Consistency, lc.Job, job.JoinEndpoints(p.Endpoints))
}

// loop follows the job until every worker has exited: the shard maps, the
// processes' report lines and exits. It ends early, with the error, when
// the shard map's writer fails or ctx ends.
func (p *psLaunch) loop(ctx context.Context, s *psRun) error {
	for s.running > 0 {
		select {
		case m := <-s.maps:
			p.shardMap(m)
		case err := <-s.mapDone:
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("phalanx: shard map: %w", err)
			}
			s.mapDone = nil
		case l := <-s.lines:
			p.line(s, l)
		case x := <-s.exits:
			p.exited(s, x)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// drain takes the lines already written.
func (p *psLaunch) drain(s *psRun) {
	for drained := false; !drained; {
		select {
		case l := <-s.lines:
			p.line(s, l)
		default:
			drained = true
		}
	}
}

// line takes one stdout line of a process (take), keeping the job's end.
func (p *psLaunch) line(s *psRun, l launch.Line) {
	if done := p.take(l, s.start, s.failures); done != nil {
		s.done = done
	}
}

// take turns a worker's report line into events and progress lines; done
// is the job's end (ps_done), and a worker's failure's reason goes in
// failures. A worker's line that is no report is passed on to Output; a
// server's lines are ignored.
func (p *psLaunch) take(l launch.Line, start time.Time, failures map[int]string) (done *Done) {
	if l.Role != "ps-worker" {
		return
	}
	r, err := p.types.Parse(l)
	if err != nil {
		fmt.Fprintf(p.Out, "worker %d: %s\n", l.Index, l.Text)
		return
	}
	switch r := r.(type) {
	case Step:
		job.Emit(p.Events, l.Index, r)
		eta := time.Duration(float64(p.now().Sub(start)) * float64(r.Steps-r.Step) / float64(max(r.Step, 1)))
		fmt.Fprintf(p.Out, "step %6d/%d  epoch %d  loss %.4f  %8.0f examples/s  ETA %s\n", r.Step, r.Steps, r.Epoch, r.Loss, r.SamplesPS, eta.Round(time.Second))
	case Checkpoint:
		job.Emit(p.Events, l.Index, r)
		fmt.Fprint(p.Out, r.text())
	case Done:
		done = &r
	case Share:
		job.Emit(p.Events, l.Index, r)
		fmt.Fprint(p.Out, r.takeover())
	case ShareDone:
		job.Emit(p.Events, l.Index, r)
	case job.Failed:
		failures[l.Index] = r.Reason
	}
	return done
}

// exited judges a process's exit: a worker's is one fewer running, and a
// failure (ps_worker_lost) unless its status is 0; a server's is warned of
// unless it was killed. A child's lines all come before its exit: its last
// word (a failure's reason) is taken before its exit is judged.
func (p *psLaunch) exited(s *psRun, x launch.Exit) {
	p.drain(s)
	role := "worker"
	if x.Role == "ps-server" {
		role = "ps"
		if s.running > 0 && !launch.Signalled(x.Err) {
			p.Log.Warn("a parameter server ended", zap.Int("server", x.Index), zap.Int("pid", x.Pid), zap.Error(x.Err))
		}
	} else {
		p.workerExited(s, x)
	}
	p.Events.Emit("worker_exited", events.F("worker", x.Index), events.F("pid", x.Pid), events.F("role", role), events.F("status", job.ExitText(x.Err)))
}

// workerExited counts a worker's exit; a failed one is lost
// (ps_worker_lost), the first failure kept as the job's.
func (p *psLaunch) workerExited(s *psRun, x launch.Exit) {
	s.running--
	if x.Err == nil {
		return
	}
	// Its shares go to the workers left (ps_workers.go); the
	// job fails only if none is left to finish them.
	why := s.failures[x.Index]
	if why == "" {
		why = x.Err.Error()
	}
	if s.failed == nil {
		s.failed = fmt.Errorf("worker %d (pid %d) failed: %s", x.Index, x.Pid, why)
	}
	p.Events.Emit("ps_worker_lost", events.F("worker", x.Index), events.F("pid", x.Pid), events.F("status", job.ExitText(x.Err)),
		events.F("reason", why), events.F("workers_left", s.running))
	fmt.Fprintf(p.Out, "worker %d (pid %d) lost: %s; %d workers left\n", x.Index, x.Pid, why, s.running)
}

// end is the job's end, once every worker has exited: done if a worker
// reported it, else the first worker's failure, else an error saying none
// reported it.
func (s *psRun) end() (*Done, error) {
	if s.done == nil {
		if s.failed != nil {
			return nil, s.failed
		}
		return nil, errors.New("phalanx: every worker ended and none reported the job done")
	}
	return s.done, nil
}

// reportDone tells of the job's end: the done event with the held-out
// measures and the first table's shards' accounts, and a line of Output.
func (p *psLaunch) reportDone(done *Done, shards []ShardAccount, start time.Time) {
	fields := []events.Field{events.F("steps", done.Steps), events.F("shards", shards)}
	names := make([]string, 0, len(done.Metrics))
	for k := range done.Metrics {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fields = append(fields, events.F(k, done.Metrics[k]))
	}
	p.Events.Emit("done", fields...)
	fmt.Fprintf(p.Out, "done: %d steps in %s; held-out %s\n", done.Steps, p.now().Sub(start).Round(time.Millisecond), done.metrics())
}

// pushAccounts reads every shard's account of the pushes once the workers
// are done, after steps, reports it (ps_pushes, one event a shard and
// table) and returns the first table's (nil if they could not be read).
func (p *psLaunch) pushAccounts(ctx context.Context, steps int64) []ShardAccount {
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	accounts, err := psAccounts(actx, p.Coord, p.rec, p.Sec.Client(), p.Log.Named("accounts"))
	if err != nil {
		p.Log.Warn("the shards' accounts of the pushes", zap.Error(err))
		fmt.Fprintf(p.Out, "the shards' accounts of the pushes: %v\n", err)
		return nil
	}
	mode, _ := ps.ParseMode(p.rec.Consistency)
	var first []ShardAccount
	for _, a := range accounts {
		if a.Table == p.rec.Tables[0].Id {
			first = append(first, ShardAccount{Shard: a.Shard, Clock: a.Info.Clock, Rows: a.Info.Rows, Pushes: a.Info.LastIDs})
		}
		var pushes []map[string]any
		for share, c := range a.Info.Pushes {
			pushes = append(pushes, map[string]any{"share": share, "last": c.Last, "applied": c.Applied, "duplicates": c.Duplicates, "base": c.Base,
				"again": c.Again, "skipped": c.Skipped})
		}
		fields := []events.Field{events.F("table", a.Table), events.F("shard", a.Shard), events.F("clock", a.Info.Clock), events.F("pushes", pushes)}
		if mode != ps.ASP {
			fields = append(fields, events.F("exactly_once", a.exactlyOnce(mode, steps)))
		}
		p.Events.Emit("ps_pushes", fields...)
	}
	return first
}

// shardMap reports a new shard map and its failovers.
func (p *psLaunch) shardMap(m *phalanxpb.ShardMap) {
	var shards []map[string]any
	for _, s := range m.Shards {
		shards = append(shards, map[string]any{"shard": s.Shard, "primary": s.Primary, "backups": s.Backups})
	}
	var srv []map[string]any
	for _, s := range m.Servers {
		srv = append(srv, map[string]any{"id": s.Id, "pid": s.Pid, "addr": s.Addr})
	}
	p.Events.Emit("ps_shard_map", events.F("generation", m.Generation), events.F("shards", shards), events.F("servers", srv), events.F("reason", m.Reason))
	fmt.Fprintf(p.Out, "shard map %d: %s\n", m.Generation, m.Reason)
	for _, f := range m.Failovers {
		p.Events.Emit("ps_failover", events.F("generation", m.Generation), events.F("shard", f.Shard), events.F("old", f.Old), events.F("new", f.New))
		fmt.Fprintf(p.Out, "  shard %d: %s took over from %s\n", f.Shard, f.New, f.Old)
	}
}

// RunServer runs one parameter server of a job (cfg.Job on cfg.Etcd)
// until ctx ends: it reads the job's record, hosts every shard and serves
// the role the shard map gives it. onReady, when set, is told its address.
func RunServer(ctx context.Context, cfg job.Config, id string, onReady func(addr string)) error {
	log, coord, done, err := psProcess(ctx, &cfg)
	if err != nil {
		return err
	}
	defer done()
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	listen := cfg.Bind
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	sec, err := job.LoadSecurity(&cfg)
	if err != nil {
		return err
	}
	ready := func(addr string) {
		cfg.Observe.Ready("") // /readyz: the server serves its shards
		if onReady != nil {
			onReady(addr)
		}
	}
	return cluster.Serve(ctx, coord, cluster.NodeConfig{ID: id, Listen: listen, Advertise: cfg.Advertise, LeaseTTL: cfg.LeaseTTL,
		Logger: log.With(zap.String("ps", id)), OnReady: ready, TLS: sec.Server(), DialTLS: sec.Client()})
}

// runPSWorkerProcess is worker index of a parameter-server job: it reads
// the job's record, follows the shard map, claims its own share of the
// data and trains it, then takes over the shares of workers that died,
// until every share is done (ps_workers.go). Whoever trains share 0
// reports progress and takes the checkpoints.
func runPSWorkerProcess(ctx context.Context, cfg job.Config, reg *job.Registry, index int) (*job.Result, error) {
	log, coord, done, err := psProcess(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer done()
	rec, err := cluster.ReadJob(ctx, coord)
	if err != nil {
		return nil, err
	}
	spec, err := cluster.SpecOf(rec)
	if err != nil {
		return nil, err
	}
	model, err := reg.Lookup(rec.Model)
	if err != nil || model.PS == nil {
		return nil, fmt.Errorf("phalanx: the job's model %q is not a parameter-server model here (%v)", rec.Model, err)
	}
	if index < 0 || index >= int(rec.Workers) {
		return nil, job.Invalid("Index", index, "worker of a job of %d workers", rec.Workers)
	}
	if rec.RestoreStep < 0 || rec.RestoreStep > rec.Steps {
		return nil, fmt.Errorf("phalanx: the checkpoint's step %d is not within the job's %d steps", rec.RestoreStep, rec.Steps)
	}
	dir, err := cluster.NewDirectory(ctx, coord)
	if err != nil {
		return nil, err
	}
	sec, err := job.LoadSecurity(&cfg)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	w := &psWorkerProc{cfg: cfg, log: log, coord: coord, job: rec, spec: spec, model: model, dir: dir, tls: sec.Client(),
		rep: job.NewReporter(cfg.Reports), index: index, id: fmt.Sprintf("%s-%d-w%d", host, os.Getpid(), index)}
	if err := w.run(ctx); err != nil {
		return nil, err
	}
	return &job.Result{Step: rec.Steps}, nil
}

// psProcess is the common start of a parameter-server job's processes: a
// logger and the job's records on its etcd; done closes the client.
func psProcess(ctx context.Context, cfg *job.Config) (log *zap.Logger, coord *coordinator.Job, done func(), err error) {
	switch {
	case cfg.Job == "":
		return nil, nil, nil, job.Invalid("Job", "", "a parameter-server process joins a named job")
	case len(cfg.Etcd) == 0:
		return nil, nil, nil, job.Invalid("Etcd", cfg.Etcd, "a parameter-server process needs the job's etcd endpoints")
	}
	keys, err := coordinator.KeysFor(cfg.Job)
	if err != nil {
		return nil, nil, nil, job.Invalid("Job", cfg.Job, "%v", err)
	}
	log = cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	cli, err := job.DialEtcd(ctx, cfg, log)
	if err != nil {
		return nil, nil, nil, err
	}
	return log, coordinator.NewJob(cli, keys), func() { cli.Close() }, nil
}
