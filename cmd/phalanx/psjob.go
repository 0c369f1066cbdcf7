package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/examples/sparselr"
	"github.com/phalanx-rt/phalanx/internal/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
	"github.com/phalanx-rt/phalanx/ps/cluster"
)

// psFlags are phalanx train's parameter-server flags (--example sparse-lr).
type psFlags struct {
	servers, shards, replicas int
	partition, optimizer      string
	lr                        float64
	staleness                 int
	ids, examples, heldOut    int
	epochs, features          int
	zipf, sigma               float64
	reportEvery               int
	cacheRows                 int
	cacheStaleness            int64
}

func (p *psFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&p.servers, "ps-servers", 2, "sparse-lr: parameter server processes to start")
	fs.IntVar(&p.shards, "ps-shards", 0, "sparse-lr: shards of the parameters (default: --ps-servers)")
	fs.IntVar(&p.replicas, "ps-replicas", -1, "sparse-lr: backups of each shard (default: 1 with two servers or more)")
	fs.StringVar(&p.partition, "ps-partition", "hash", "sparse-lr: how keys split between shards: range or hash (consistent)")
	fs.StringVar(&p.optimizer, "ps-optimizer", "adagrad", "sparse-lr: the servers' optimizer: sgd, adagrad or adam")
	fs.Float64Var(&p.lr, "ps-lr", 0.2, "sparse-lr: the servers' learning rate")
	fs.IntVar(&p.staleness, "staleness", 3, "sparse-lr with --sync ssp: how many clocks a worker may run ahead of the slowest")
	fs.IntVar(&p.ids, "ids", 1_000_000, "sparse-lr: feature ids")
	fs.IntVar(&p.examples, "examples", 500_000, "sparse-lr: training examples of the synthetic click log")
	fs.IntVar(&p.heldOut, "held-out", 50_000, "sparse-lr: held-out examples (AUC and log-loss)")
	fs.IntVar(&p.epochs, "epochs", 2, "sparse-lr: passes over the training examples")
	fs.IntVar(&p.features, "features", 16, "sparse-lr: feature ids per example")
	fs.Float64Var(&p.zipf, "zipf", 1.2, "sparse-lr: the Zipf exponent of the feature ids")
	fs.Float64Var(&p.sigma, "sigma", 0.45, "sparse-lr: the spread of the teacher's weights (0.45: a best AUC of about 0.82)")
	fs.IntVar(&p.cacheRows, "ps-cache-rows", 0, "sparse-lr: rows each worker caches (hot keys; 0: no cache)")
	fs.Int64Var(&p.cacheStaleness, "ps-cache-staleness", 1, "sparse-lr: clocks a cached row may serve pulls after it was pulled")
	fs.IntVar(&p.reportEvery, "report-every", 0, "sparse-lr: steps between progress reports (default: a twentieth of the job)")
}

// psJobOf checks the flags and builds the job record.
func psJobOf(c trainConfig, p psFlags) (*phalanxpb.PSJob, error) {
	if p.shards == 0 {
		p.shards = p.servers
	}
	if p.replicas < 0 {
		p.replicas = min(1, p.servers-1)
	}
	switch {
	case p.servers < 1 || p.servers > 64:
		return nil, usagef("--ps-servers %d: want 1..64", p.servers)
	case p.shards < 1 || p.shards > 4096:
		return nil, usagef("--ps-shards %d: want 1..4096", p.shards)
	case p.replicas >= p.servers:
		return nil, usagef("--ps-replicas %d: a shard's copies need as many servers; want below --ps-servers %d", p.replicas, p.servers)
	case p.ids < 2 || p.examples < 1 || p.heldOut < 2 || p.epochs < 1 || p.features < 1 || p.features > 1024:
		return nil, usagef("--ids, --examples, --held-out, --epochs and --features must be positive (--features at most 1024)")
	case p.cacheRows < 0 || p.cacheStaleness < 0:
		return nil, usagef("--ps-cache-rows and --ps-cache-staleness must not be negative")
	case c.train.batch < c.workers:
		return nil, usagef("--batch %d: each of the %d workers needs at least one example per step", c.train.batch, c.workers)
	case p.examples/c.workers < c.train.batch/c.workers:
		return nil, usagef("--examples %d: each worker's share is smaller than its batch of %d", p.examples, c.train.batch/c.workers)
	}
	mode := c.train.sync.mode
	if mode == "async" {
		mode = "asp"
	}
	if _, err := ps.ParseMode(mode); err != nil {
		return nil, usagef("--sync %q with --example sparse-lr: want bsp, asp (async), ssp or hybrid", c.train.sync.mode)
	}
	deadline := 200 * time.Millisecond
	if d := c.train.sync.deadlineText; d != "auto" {
		v, err := time.ParseDuration(d)
		if err != nil || v <= 0 {
			return nil, usagef("--step-deadline %q: want a positive duration (sparse-lr has no auto deadline)", d)
		}
		deadline = v
	}
	var decay float32
	if c.train.sync.stale == "decay" {
		decay = float32(c.train.sync.staleDecay)
	}
	j := &phalanxpb.PSJob{Shards: uint32(p.shards), Replicas: uint32(p.replicas), Partition: p.partition, Servers: uint32(p.servers),
		Workers: uint32(c.workers), Consistency: mode, CacheRows: uint32(p.cacheRows), CacheStaleness: p.cacheStaleness, Staleness: int32(p.staleness), Quorum: c.train.sync.quorum,
		DeadlineNanos: int64(deadline), Decay: decay,
		Tables: []*phalanxpb.PSTable{{Id: sparselr.Table, Name: "sparse-lr", Dim: 1, KeySpace: uint64(p.ids) + 1, Init: "zeros",
			Optimizer: p.optimizer, Lr: float32(p.lr)}},
		Example: &phalanxpb.SparseLR{Ids: uint64(p.ids), Features: uint32(p.features), Zipf: p.zipf, Sigma: p.sigma, Seed: c.train.seed,
			Examples: uint64(p.examples), HeldOut: uint64(p.heldOut), Epochs: uint32(p.epochs), Batch: uint32(c.train.batch / c.workers)}}
	if _, err := cluster.SpecOf(j); err != nil {
		return nil, usagef("%v", err)
	}
	if _, err := sparselr.NewGenerator(exampleConfig(j.Example)); err != nil {
		return nil, usagef("%v", err)
	}
	return j, nil
}

func exampleConfig(e *phalanxpb.SparseLR) sparselr.Config {
	return sparselr.Config{IDs: int(e.Ids), Features: int(e.Features), Zipf: e.Zipf, Sigma: e.Sigma, Seed: e.Seed}
}

// psReport is a sparse-lr worker's report line.
type psReport struct {
	Kind      string      `json:"kind"` // step or done
	Worker    int         `json:"worker"`
	Step      int64       `json:"step"`
	Steps     int64       `json:"steps"`
	Epoch     int         `json:"epoch"`
	Loss      float64     `json:"loss"`
	SamplesPS float64     `json:"samples_per_s"`
	Stale     int         `json:"stale"`
	AUC       float64     `json:"auc,omitempty"`
	LogLoss   float64     `json:"logloss,omitempty"`
	BayesAUC  float64     `json:"bayes_auc,omitempty"`
	Shards    []shardDone `json:"shards,omitempty"`
}

// shardDone is a shard's account at the end: its clock, rows, and the
// pushes applied from each worker (each exactly once).
type shardDone struct {
	Shard  int      `json:"shard"`
	Clock  int64    `json:"clock"`
	Rows   uint64   `json:"rows"`
	Pushes []uint64 `json:"pushes"`
}

// psTrain runs a parameter-server job: etcd, the shard-map coordinator, the
// server processes and the worker processes, until every worker is done.
func psTrain(ctx context.Context, c trainConfig, p psFlags, stdout, stderr io.Writer, log *zap.Logger) error {
	job, err := psJobOf(c, p)
	if err != nil {
		return err
	}
	var ev *events.Log
	if c.eventsPath != "" {
		f, err := os.OpenFile(c.eventsPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("--events: %w", err)
		}
		defer f.Close()
		ev = events.New(f, nil)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	endpoints, cli, keys, stopEtcd, err := jobEtcd(context.WithoutCancel(ctx), c, log)
	if err != nil {
		return err
	}
	defer stopEtcd()
	if u := c.train.ckpt.url; u != "" {
		if c.train.ckpt.every != 0 {
			return usagef("--checkpoint-every: sparse-lr checkpoints by steps (--checkpoint-every-steps) and at the end")
		}
		store, err := checkpoint.OpenURL(ctx, u, c.s3.credentials())
		if err != nil {
			return fmt.Errorf("--checkpoint: %w", err)
		}
		job.Checkpoint, job.CheckpointEvery = u, uint64(max(c.train.ckpt.everySteps, 0))
		m, _, err := cluster.Latest(ctx, store)
		switch {
		case errors.Is(err, cluster.ErrNoCheckpoint):
			if c.train.ckpt.resume {
				return fmt.Errorf("--resume: %s holds no parameter-server checkpoint", store.Location())
			}
		case err != nil:
			return fmt.Errorf("--checkpoint: %w (nothing was overwritten; remove the broken checkpoints with phalanx ckpt rm, or use another store)", err)
		default:
			job.RestoreFrom, job.RestoreStep = cluster.Prefix(m.Step), m.Step
			ev.Emit("restored", events.F("step", m.Step), events.F("from_shards", m.Shards), events.F("shards", job.Shards), events.F("checkpoint", job.RestoreFrom))
			fmt.Fprintf(stdout, "resuming from the checkpoint of step %d (%d shards) in %s, into %d shards\n", m.Step, m.Shards, store.Location(), job.Shards)
		}
	}
	if err := cluster.WriteJob(ctx, cli, keys, job); err != nil {
		return err
	}
	maps := make(chan *phalanxpb.ShardMap, 16)
	mapDone := make(chan error, 1)
	host, _ := os.Hostname()
	go func() {
		mapDone <- coordinator.RunShardMap(ctx, cli, keys, coordinator.ShardMapConfig{ID: fmt.Sprintf("%s-%d", host, os.Getpid()),
			Shards: int(job.Shards), Replicas: int(job.Replicas), Servers: int(job.Servers), SessionTTL: c.member.leaseTTL,
			Logger: log.Named("shardmap"), OnMap: func(m *phalanxpb.ShardMap) {
				select {
				case maps <- m:
				case <-ctx.Done():
				}
			}})
	}()
	defer func() { // the shard map's writer ends before the client and etcd close
		cancel()
		if mapDone != nil {
			<-mapDone
		}
	}()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	common := []string{"--etcd-endpoints", strings.Join(endpoints, ","), "--job", c.member.job, "--log-level", c.logLevel}
	type line struct {
		server bool
		index  int
		text   []byte
	}
	type exit struct {
		server bool
		index  int
		pid    int
		err    error
	}
	lines := make(chan line, 64)
	exits := make(chan exit, int(job.Servers)+c.workers)
	var servers, workers []*launch.Proc
	alive := 0     // processes whose exit has not been received
	defer func() { // every child is reaped by its own goroutine's Wait: kill, then wait for the exits
		for _, pr := range append(servers, workers...) {
			pr.Cmd.Process.Kill()
		}
		for ; alive > 0; alive-- {
			<-exits
		}
	}()
	spawn := func(server bool, i int, args []string) error {
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stderr = stderr
		cmd.Env = append(os.Environ(), c.s3.env()...)
		pr, err := launch.Spawn(cmd, i)
		if err != nil {
			return err
		}
		alive++
		role := "worker"
		if server {
			servers = append(servers, pr)
			role = "ps"
		} else {
			workers = append(workers, pr)
		}
		ev.Emit("worker_started", events.F("worker", i), events.F("pid", pr.Pid()), events.F("role", role))
		go func() {
			sc := bufio.NewScanner(pr.Out)
			sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
			for sc.Scan() {
				lines <- line{server: server, index: i, text: append([]byte(nil), sc.Bytes()...)}
			}
			exits <- exit{server: server, index: i, pid: pr.Pid(), err: pr.Cmd.Wait()}
		}()
		return nil
	}
	for i := range int(job.Servers) {
		if err := spawn(true, i, append([]string{"ps", "--id", fmt.Sprintf("ps-%d", i), "--lease-ttl", c.member.leaseTTL.String()}, common...)); err != nil {
			return err
		}
	}
	threads := launch.ThreadsPerRank(c.threads, c.workers+int(job.Servers))
	for i := range c.workers {
		if err := spawn(false, i, append([]string{"ps-worker", "--worker-index", strconv.Itoa(i), "--threads", strconv.Itoa(threads),
			"--report-every", strconv.Itoa(p.reportEvery)}, common...)); err != nil {
			return err
		}
	}
	ev.Emit("job_started", events.F("job", c.member.job), events.F("etcd_endpoints", strings.Join(endpoints, ",")),
		events.F("workers", c.workers), events.F("ps_servers", job.Servers), events.F("ps_shards", job.Shards), events.F("ps_replicas", job.Replicas),
		events.F("consistency", job.Consistency))
	fmt.Fprintf(stdout, "phalanx train: sparse-lr on %d workers and %d parameter servers (%d shards, %d backups each, %s, %s); job %s, etcd %s\n",
		c.workers, job.Servers, job.Shards, job.Replicas, job.Partition, job.Consistency, c.member.job, strings.Join(endpoints, ","))
	start := time.Now()
	running := c.workers
	var done *psReport
	var failed error
	for running > 0 {
		select {
		case m := <-maps:
			var shards []map[string]any
			for _, s := range m.Shards {
				shards = append(shards, map[string]any{"shard": s.Shard, "primary": s.Primary, "backups": s.Backups})
			}
			var srv []map[string]any
			for _, s := range m.Servers {
				srv = append(srv, map[string]any{"id": s.Id, "pid": s.Pid, "addr": s.Addr})
			}
			ev.Emit("ps_shard_map", events.F("generation", m.Generation), events.F("shards", shards), events.F("servers", srv), events.F("reason", m.Reason))
			fmt.Fprintf(stdout, "shard map %d: %s\n", m.Generation, m.Reason)
			for _, f := range m.Failovers {
				ev.Emit("ps_failover", events.F("generation", m.Generation), events.F("shard", f.Shard), events.F("old", f.Old), events.F("new", f.New))
				fmt.Fprintf(stdout, "  shard %d: %s took over from %s\n", f.Shard, f.New, f.Old)
			}
		case err := <-mapDone:
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("shard map: %w", err)
			}
			mapDone = nil
		case l := <-lines:
			if l.server {
				continue
			}
			var r psReport
			if err := json.Unmarshal(l.text, &r); err != nil {
				fmt.Fprintf(stdout, "worker %d: %s\n", l.index, l.text)
				continue
			}
			switch r.Kind {
			case "step":
				ev.Emit("step", events.F("step", r.Step), events.F("worker", r.Worker), events.F("epoch", r.Epoch), events.F("loss", r.Loss),
					events.F("samples_per_s", r.SamplesPS), events.F("stale", r.Stale))
				eta := time.Duration(float64(time.Since(start)) * float64(r.Steps-r.Step) / float64(max(r.Step, 1)))
				fmt.Fprintf(stdout, "step %6d/%d  epoch %d  log-loss %.4f  %8.0f examples/s  ETA %s\n", r.Step, r.Steps, r.Epoch, r.Loss, r.SamplesPS, eta.Round(time.Second))
			case "checkpoint":
				ev.Emit("checkpoint_saved", events.F("step", r.Step), events.F("shards", len(r.Shards)))
				fmt.Fprintf(stdout, "checkpoint of step %d saved (%d shards)\n", r.Step, len(r.Shards))
			case "done":
				done = &r
			}
		case x := <-exits:
			alive--
			if x.server {
				if running > 0 && !signalled(x.err) {
					log.Warn("a parameter server ended", zap.Int("server", x.index), zap.Int("pid", x.pid), zap.Error(x.err))
				}
				ev.Emit("worker_exited", events.F("worker", x.index), events.F("pid", x.pid), events.F("role", "ps"), events.F("status", exitText(x.err)))
				continue
			}
			running--
			ev.Emit("worker_exited", events.F("worker", x.index), events.F("pid", x.pid), events.F("role", "worker"), events.F("status", exitText(x.err)))
			if x.err != nil && failed == nil {
				failed = fmt.Errorf("worker %d (pid %d) failed: %w", x.index, x.pid, x.err)
				cancel()
			}
		case <-ctx.Done():
			if failed != nil {
				continue
			}
			return context.Cause(ctx)
		}
	}
	for {
		select {
		case l := <-lines:
			var r psReport
			if !l.server && json.Unmarshal(l.text, &r) == nil && r.Kind == "done" {
				done = &r
			}
			continue
		default:
		}
		break
	}
	for _, s := range servers { // they leave the shard map at once; the deferred kill reaps them
		s.Signal(syscall.SIGTERM)
	}
	if failed != nil {
		return failed
	}
	if done == nil {
		return errors.New("every worker ended and none reported the job done")
	}
	ev.Emit("done", events.F("steps", done.Steps), events.F("auc", done.AUC), events.F("logloss", done.LogLoss),
		events.F("bayes_auc", done.BayesAUC), events.F("shards", done.Shards))
	fmt.Fprintf(stdout, "done: %d steps in %s; held-out AUC %.4f (the generator's teacher reaches %.4f), log-loss %.4f\n",
		done.Steps, time.Since(start).Round(time.Millisecond), done.AUC, done.BayesAUC, done.LogLoss)
	return nil
}

func exitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// runPS is phalanx ps: one parameter server process of a job.
func runPS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ps",
		"Runs one parameter server of a job: it reads the job's configuration from etcd, hosts every shard,\n"+
			"registers with a lease and serves the role the coordinator's shard map gives it (primary of some\n"+
			"shards, backup of others). phalanx train --example sparse-lr starts these itself.", stderr)
	var m membershipFlags
	m.register(fs)
	id := fs.String("id", "", "this server's id (default: host-pid)")
	listen := fs.String("listen", "127.0.0.1:0", "the data plane's address")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, cli, keys, done, err := psProcess("ps", m, *logLevel, stderr)
	if err != nil {
		return err
	}
	defer done()
	if *id == "" {
		host, _ := os.Hostname()
		*id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	return cluster.Serve(ctx, cli, keys, cluster.NodeConfig{ID: *id, Listen: *listen, LeaseTTL: m.leaseTTL, Logger: log.With(zap.String("ps", *id)),
		OnReady: func(addr string) { fmt.Fprintf(stdout, "ps %s serving on %s\n", *id, addr) }})
}

// psProcess is the common start of a parameter-server job's processes:
// the membership flags checked, the logger, and a client of the job's etcd;
// done flushes and closes them.
func psProcess(cmd string, m membershipFlags, logLevel string, stderr io.Writer) (log *zap.Logger, cli *clientv3.Client, keys coordinator.Keys, done func(), err error) {
	if err := m.check(); err != nil {
		return nil, nil, keys, nil, err
	}
	if m.job == "" || len(m.endpointList()) == 0 {
		return nil, nil, keys, nil, usagef("%s: --job and --etcd-endpoints are required", cmd)
	}
	if keys, err = coordinator.KeysFor(m.job); err != nil {
		return nil, nil, keys, nil, err
	}
	if log, err = newLogger(logLevel, stderr); err != nil {
		return nil, nil, keys, nil, err
	}
	cli, err = clientv3.New(clientv3.Config{Endpoints: m.endpointList(), DialTimeout: 5 * time.Second, Logger: log.Named("etcd-client")})
	if err != nil {
		log.Sync()
		return nil, nil, keys, nil, fmt.Errorf("etcd %s: %w", m.endpoints, err)
	}
	return log, cli, keys, func() { cli.Close(); log.Sync() }, nil
}

// runPSWorker is one sparse-lr worker of a parameter-server job.
func runPSWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ps-worker", "One sparse-lr worker of a parameter-server job (phalanx train starts these).", stderr)
	var m membershipFlags
	m.register(fs)
	index := fs.Int("worker-index", 0, "this worker's index, 0..workers-1")
	threads := fs.Int("threads", 0, "GOMAXPROCS (0: the Go default)")
	every := fs.Int("report-every", 0, "steps between progress reports (0: a twentieth of the job)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *threads > 0 {
		runtime.GOMAXPROCS(*threads)
	}
	log, cli, keys, done, err := psProcess("ps-worker", m, *logLevel, stderr)
	if err != nil {
		return err
	}
	defer done()
	job, err := cluster.ReadJob(ctx, cli, keys)
	if err != nil {
		return err
	}
	spec, err := cluster.SpecOf(job)
	if err != nil {
		return err
	}
	if job.Example == nil || *index < 0 || *index >= int(job.Workers) {
		return usagef("ps-worker: worker %d of a job of %d workers (or a job without the sparse-lr example)", *index, job.Workers)
	}
	dir, err := cluster.NewDirectory(ctx, cli, keys)
	if err != nil {
		return err
	}
	cl, err := ps.NewClient(ps.ClientConfig{Worker: *index, Tables: spec.Tables, Partition: spec.Partition, Shards: spec.Shards,
		Sync: spec.Sync, Directory: dir, Logger: log.Named("ps-client"), CacheRows: int(job.CacheRows), CacheStaleness: job.CacheStaleness})
	if err != nil {
		return err
	}
	defer cl.Close()
	ex := job.Example
	gen, err := sparselr.NewGenerator(exampleConfig(ex))
	if err != nil {
		return err
	}
	train := gen.Draw(int(ex.Examples), 0)
	n, b := int(job.Workers), int(ex.Batch)
	lo := *index * train.Len() / n
	perEpoch := (train.Len() / n) / b // the same on every worker: bsp waits for all
	total := int64(perEpoch) * int64(ex.Epochs)
	if *every <= 0 {
		*every = int(max(1, total/20))
	}
	enc := json.NewEncoder(stdout)
	model := sparselr.NewModel(cl, int(ex.Ids))
	var saver *cluster.Saver
	if job.Checkpoint != "" && *index == 0 {
		store, err := checkpoint.OpenURL(ctx, job.Checkpoint, checkpoint.Credentials{})
		if err != nil {
			return err
		}
		saver = &cluster.Saver{Store: store, Client: cl, Tables: []uint32{sparselr.Table}, Spec: spec}
	}
	step := job.RestoreStep
	if step < 0 || step > total {
		return fmt.Errorf("the checkpoint's step %d is not within the job's %d steps (fewer --epochs or --examples than it was trained with?)", step, total)
	}
	if err := cl.SetClock(sparselr.Table, step); err != nil {
		return err
	}
	idx := make([]int, b)
	var lossSum float64
	var stale, since int
	t0 := time.Now()
	for ; step < total; step++ {
		epoch, k := int(step)/perEpoch, int(step)%perEpoch
		{
			for i := range idx {
				idx[i] = lo + k*b + i
			}
			loss, st, err := model.Step(ctx, train, idx)
			if err != nil {
				return fmt.Errorf("step %d: %w", step+1, err)
			}
			since++
			lossSum += loss
			stale += st
			done := step + 1
			if *index == 0 && (done%int64(*every) == 0 || done == total) {
				secs := time.Since(t0).Seconds()
				enc.Encode(psReport{Kind: "step", Worker: *index, Step: done, Steps: total, Epoch: epoch, Loss: lossSum / float64(since),
					SamplesPS: float64(since*b*n) / secs, Stale: stale})
				lossSum, stale, since, t0 = 0, 0, 0, time.Now()
			}
			if saver != nil && ((job.CheckpointEvery > 0 && done%int64(job.CheckpointEvery) == 0) || done == total) {
				m, err := saver.Save(ctx, done, done) // every shard at clock done: exactly done steps under bsp
				if err != nil {
					return err
				}
				shards := make([]shardDone, m.Shards)
				enc.Encode(psReport{Kind: "checkpoint", Worker: 0, Step: done, Steps: total, Shards: shards})
			}
		}
	}
	if *index != 0 {
		return nil
	}
	test := gen.Draw(int(ex.HeldOut), 1)
	p := make([]float32, test.Len())
	if err := model.Predict(ctx, test, 0, test.Len(), p); err != nil {
		return fmt.Errorf("scoring the held-out log: %w", err)
	}
	r := psReport{Kind: "done", Worker: 0, Step: step, Steps: total, AUC: sparselr.AUC(p, test.Clicked), LogLoss: sparselr.LogLoss(p, test.Clicked),
		BayesAUC: sparselr.BayesAUC(test)}
	for s := range spec.Shards {
		info, err := cl.Info(ctx, sparselr.Table, s)
		if err != nil {
			return fmt.Errorf("shard %d's account: %w", s, err)
		}
		r.Shards = append(r.Shards, shardDone{Shard: s, Clock: info.Clock, Rows: info.Rows, Pushes: info.LastIDs})
	}
	return enc.Encode(r)
}

// jobEtcd connects to the job's etcd: the --etcd-endpoints cluster, or an
// embedded server with its data under --job-dir (a temporary directory by
// default, removed by the returned stop). stop closes the client and the
// server.
func jobEtcd(ctx context.Context, c trainConfig, log *zap.Logger) (endpoints []string, cli *clientv3.Client, keys coordinator.Keys, stop func(), err error) {
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if keys, err = coordinator.KeysFor(c.member.job); err != nil {
		return nil, nil, keys, stop, err
	}
	endpoints = c.member.endpointList()
	if len(endpoints) == 0 {
		dir := c.jobDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "phalanx-job-")
			if err != nil {
				return nil, nil, keys, stop, err
			}
			undo = append(undo, func() { os.RemoveAll(tmp) })
			dir = tmp
		}
		e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: filepath.Join(dir, "etcd"), Logger: log.Named("etcd")})
		if err != nil {
			return nil, nil, keys, stop, err
		}
		undo = append(undo, func() { e.Close() })
		endpoints = e.Endpoints()
	}
	cli, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: log.Named("etcd-client")})
	if err != nil {
		return nil, nil, keys, stop, fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	undo = append(undo, func() { cli.Close() })
	return endpoints, cli, keys, stop, nil
}
