package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/examples/mlp"
	"github.com/phalanx-rt/phalanx/failure"
	"github.com/phalanx-rt/phalanx/internal/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

type trainConfig struct {
	train             trainFlags
	member            membershipFlags
	workers           int
	minWorkers        int
	maxWorkers        int
	minWorkersTimeout time.Duration
	joinWindow        time.Duration
	eventsPath        string
	jobDir            string
	threads           int
	logLevel          string
	coordinate        bool
	s3                s3Flags
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("train",
		"Trains an example model data-parallel on --workers local elastic worker processes, like torchrun.\n"+
			"Membership lives in etcd: an embedded etcd server (data under --job-dir) unless --etcd-endpoints\n"+
			"names a cluster; a coordinator in this process decides the generations (rings). A worker that\n"+
			"dies is removed and the others go on; workers started later (phalanx worker) join. Shows progress\n"+
			"(step, loss, samples/s, ETA) and membership changes, and ends with the held-out loss and accuracy.", stderr)
	var c trainConfig
	c.train.register(fs)
	c.member.register(fs)
	fs.IntVar(&c.workers, "workers", 2, "worker processes to start, 1..64")
	fs.IntVar(&c.minWorkers, "min-workers", 1, "fewest workers the job trains with")
	fs.IntVar(&c.maxWorkers, "max-workers", 0, "most workers admitted to a ring (default: --workers)")
	fs.DurationVar(&c.minWorkersTimeout, "min-workers-timeout", time.Minute, "stop the job when it stays below --min-workers this long")
	fs.DurationVar(&c.joinWindow, "join-window", time.Second, "how long a newcomer waits so that newcomers arriving together enter one generation")
	fs.StringVar(&c.eventsPath, "events", "", "write the job's events as JSON lines to this file (see docs/events.md)")
	fs.StringVar(&c.jobDir, "job-dir", "", "the job's directory (embedded etcd data); default: a temporary one, removed at the end")
	fs.IntVar(&c.threads, "threads", 0, "OS threads running Go code in each worker (GOMAXPROCS); 0 = cores/workers, at least 1")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	c.s3.register(fs)
	fs.BoolVar(&c.coordinate, "coordinator", true, "run a coordinator in this process (with an external etcd, others may run standbys: phalanx coordinator)")
	var psf psFlags
	psf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.train.example == "sparse-lr" { // the parameter-server job
		if err := c.member.check(); err != nil {
			return err
		}
		if c.workers < 1 || c.workers > 64 || c.threads < 0 {
			return usagef("--workers %d: want 1..64 (and --threads not negative)", c.workers)
		}
		if c.member.job == "" {
			c.member.job = fmt.Sprintf("train-%d-%d", os.Getpid(), time.Now().Unix())
		}
		log, err := newLogger(c.logLevel, stderr)
		if err != nil {
			return err
		}
		defer log.Sync()
		return psTrain(ctx, c, psf, stdout, stderr, log)
	}
	if err := c.train.check(); err != nil {
		return err
	}
	if err := c.member.check(); err != nil {
		return err
	}
	if c.workers < 1 || c.workers > 64 {
		return usagef("--workers %d: want 1..64", c.workers)
	}
	if c.maxWorkers == 0 {
		c.maxWorkers = c.workers
	}
	switch {
	case c.minWorkers < 1 || c.maxWorkers < c.minWorkers:
		return usagef("--min-workers %d, --max-workers %d: want 1 <= min <= max", c.minWorkers, c.maxWorkers)
	case c.threads < 0:
		return usagef("--threads %d: must not be negative", c.threads)
	case c.minWorkersTimeout <= 0 || c.joinWindow < 0:
		return usagef("--min-workers-timeout must be positive and --join-window not negative")
	case c.train.failWorker >= c.workers:
		return usagef("--fail-at %q: worker %d is not below --workers", c.train.failAt, c.train.failWorker)
	}
	if c.member.job == "" {
		c.member.job = fmt.Sprintf("train-%d-%d", os.Getpid(), time.Now().Unix())
	}
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	workerArgs := passThrough(fs, func(name string) bool { return name == "lease-ttl" || name == "unreachable" || name == "log-level" })
	if c.train.rescale == "lr" && c.train.refWorld == 0 {
		workerArgs = append(workerArgs, "--reference-world="+strconv.Itoa(c.workers))
	}
	return trainJob(ctx, c, workerArgs, stdout, stderr, log)
}

// job is a running training job as its launcher sees it.
type job struct {
	c        trainConfig
	out      io.Writer
	ev       *events.Log
	start    time.Time
	every    int64
	gen      *phalanxpb.Generation // the latest generation
	first    uint64                // the first generation's number
	byPid    map[int64]int         // worker index by pid
	done     *report
	stopped  string
	stop     *report // every rank stopped at a step boundary after a final checkpoint
	stepGen  uint64  // the generation of the latest step report
	lastStep int64
}

type procLine struct {
	index int
	line  []byte
}

type procExit struct {
	index int
	pid   int
	err   error
}

// trainJob starts etcd (embedded unless external), a coordinator and the
// workers, and follows the job until a worker reports it done.
func trainJob(ctx context.Context, c trainConfig, workerArgs []string, stdout, stderr io.Writer, log *zap.Logger) error {
	j := &job{c: c, out: stdout, start: time.Now(), every: max(1, c.train.steps/20), byPid: map[int64]int{}}
	if c.eventsPath != "" {
		f, err := os.OpenFile(c.eventsPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("--events: %w", err)
		}
		defer f.Close()
		j.ev = events.New(f, nil)
	}
	// A signal (the caller's ctx) does not cancel the job's own context:
	// with checkpoints it first asks the workers for a final one.
	outer := ctx
	ctx, cancel := context.WithCancel(context.WithoutCancel(outer))
	defer cancel()
	if c.train.ckpt.url != "" { // fail before starting anything when the store is unusable
		sctx, scancel := context.WithTimeout(outer, time.Minute)
		store, err := checkpoint.OpenURL(sctx, c.train.ckpt.url, c.s3.credentials())
		scancel()
		if err != nil {
			return fmt.Errorf("--checkpoint: %w", err)
		}
		fmt.Fprintf(stdout, "checkpoints: %s\n", store.Location())
	}

	endpoints, cli, keys, stopEtcd, err := jobEtcd(ctx, c, log)
	if err != nil {
		return err
	}
	defer stopEtcd()
	coordDone := make(chan error, 1)
	followDone := make(chan struct{})
	defer func() { // stop following before the client and etcd close
		cancel()
		<-followDone
		if c.coordinate {
			<-coordDone
		}
	}()
	if c.coordinate {
		host, _ := os.Hostname()
		co, err := coordinator.New(cli, keys, coordinator.Config{ID: fmt.Sprintf("%s-%d", host, os.Getpid()),
			Rendezvous: coordinator.Rendezvous{MinWorkers: c.minWorkers, MaxWorkers: c.maxWorkers},
			JoinWindow: c.joinWindow, MinWorkersTimeout: c.minWorkersTimeout, SessionTTL: c.member.leaseTTL, Logger: log.Named("coordinator")})
		if err != nil {
			return err
		}
		go func() { coordDone <- co.Run(ctx) }()
	}
	gens := make(chan *phalanxpb.Generation, 16)
	go func() {
		defer close(followDone)
		elastic.Follow(ctx, cli, keys, log, func(g *phalanxpb.Generation) {
			select {
			case gens <- g:
			case <-ctx.Done():
			}
		})
	}()

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	threads := launch.ThreadsPerRank(c.threads, c.workers)
	lines := make(chan procLine, 64)
	exits := make(chan procExit, c.workers)
	var procs []*launch.Proc
	defer func() { launch.Kill(procs) }()
	for i := range c.workers {
		args := append([]string{"worker", "--etcd-endpoints", strings.Join(endpoints, ","), "--job", c.member.job,
			"--rank-hint", strconv.Itoa(i), "--worker-index", strconv.Itoa(i), "--threads", strconv.Itoa(threads)}, workerArgs...)
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stderr = stderr
		cmd.Env = append(os.Environ(), c.s3.env()...)
		p, err := launch.Spawn(cmd, i)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		j.ev.Emit("worker_started", events.F("worker", i), events.F("pid", p.Pid()))
		go func() {
			sc := bufio.NewScanner(p.Out)
			sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
			for sc.Scan() {
				lines <- procLine{index: i, line: append([]byte(nil), sc.Bytes()...)}
			}
			err := p.Cmd.Wait()
			exits <- procExit{index: i, pid: p.Pid(), err: err}
		}()
	}
	j.ev.Emit("job_started", events.F("job", c.member.job), events.F("etcd_endpoints", strings.Join(endpoints, ",")),
		events.F("workers", c.workers), events.F("worker_args", workerArgs))
	fmt.Fprintf(stdout, "phalanx train: %s on %d workers (min %d, max %d), %d steps, global batch %d; job %s, etcd %s\n",
		c.train.example, c.workers, c.minWorkers, c.maxWorkers, c.train.steps, c.train.batch, c.member.job, strings.Join(endpoints, ","))

	running := c.workers
	var failed error
	sigCh := outer.Done()
	var grace <-chan time.Time
	for running > 0 {
		select {
		case <-sigCh:
			sigCh = nil
			if c.train.ckpt.url == "" {
				launch.Kill(procs)
				return context.Cause(outer)
			}
			fmt.Fprintln(stdout, "stopping: the workers take a final checkpoint at the next step boundary")
			j.ev.Emit("stopping", events.F("reason", context.Cause(outer).Error()))
			for _, p := range procs {
				p.Signal(syscall.SIGTERM)
			}
			grace = time.After(c.train.ckpt.wait + time.Minute)
		case <-grace:
			launch.Kill(procs)
			return fmt.Errorf("asked to stop, the workers did not within %v; killed", c.train.ckpt.wait+time.Minute)
		case l := <-lines:
			if err := j.handle(l); err != nil {
				return err
			}
		case g := <-gens:
			j.generation(g)
		case x := <-exits:
			running--
			j.exited(x)
			if failed == nil && j.done == nil && x.err != nil && !signalled(x.err) && exitStatusOf(x.err) != exitCoordinatorStopped {
				failed = fmt.Errorf("worker %d (pid %d) failed: %w", x.index, x.pid, x.err)
				cancel() // one worker's own failure (not a kill) ends the job
			}
		case err := <-coordDone:
			coordDone <- err // for the deferred wait
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("coordinator: %w", err)
			}
			c.coordinate = false
		case <-ctx.Done():
			if failed != nil {
				continue
			}
			launch.Kill(procs)
			return ctx.Err()
		}
	}
	for {
		select {
		case l := <-lines:
			if err := j.handle(l); err != nil {
				return err
			}
			continue
		default:
		}
		break
	}
	if failed != nil {
		return failed
	}
	if j.done == nil && j.stop != nil {
		fmt.Fprintf(stdout, "stopped at step %d after a final checkpoint; run the same command to resume\n", j.stop.Step)
		return &stoppedError{step: j.stop.Step}
	}
	if j.done == nil {
		if j.stopped != "" {
			return fmt.Errorf("the coordinator stopped the job: %s", j.stopped)
		}
		return fmt.Errorf("every worker ended and none reported the job done")
	}
	fmt.Fprintf(stdout, "done: %d steps in %s; held-out loss %.4f, accuracy %.2f%%\n",
		j.done.Step, time.Since(j.start).Round(time.Millisecond), j.done.Loss, 100*j.done.Accuracy)
	return nil
}

// stoppedError: the job stopped on request after a final checkpoint.
type stoppedError struct{ step int64 }

func (e *stoppedError) Error() string {
	return fmt.Sprintf("stopped on request at step %d, after a final checkpoint", e.step)
}

// checkpointEvent logs a worker's checkpoint event.
func (j *job) checkpointEvent(e *checkpoint.Event) {
	if e == nil {
		return
	}
	switch e.Kind {
	case "saved":
		j.ev.Emit("checkpoint_saved", events.F("step", e.Step), events.F("bytes", e.Bytes), events.F("seconds", e.Seconds),
			events.F("url", e.URL), events.F("world", e.WorldAfter))
		fmt.Fprintf(j.out, "checkpoint of step %d saved: %s (%s in %.2fs)\n", e.Step, e.URL, humanBytes(e.Bytes), e.Seconds)
	case "failed":
		j.ev.Emit("checkpoint_failed", events.F("step", e.Step), events.F("checkpoint", e.ID), events.F("error", e.Err))
		fmt.Fprintf(j.out, "checkpoint of step %d FAILED: %s\n", e.Step, e.Err)
	case "skipped":
		j.ev.Emit("checkpoint_skipped", events.F("checkpoint", e.ID), events.F("error", e.Err))
		fmt.Fprintf(j.out, "checkpoint %s skipped: %s\n", e.ID, e.Err)
	case "restored":
		j.ev.Emit("checkpoint_restored", events.F("step", e.Step), events.F("world_before", e.WorldBefore),
			events.F("world_after", e.WorldAfter), events.F("url", e.URL), events.F("bytes", e.Bytes))
		fmt.Fprintf(j.out, "resumed from %s: step %d, written by %d workers, now %d\n", e.URL, e.Step, e.WorldBefore, e.WorldAfter)
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func exitStatusOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

func signalled(err error) bool {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
			return ws.Signaled()
		}
	}
	return false
}

func (j *job) exited(x procExit) {
	status := "exit 0"
	if x.err != nil {
		status = x.err.Error()
	}
	j.ev.Emit("worker_exited", events.F("worker", x.index), events.F("pid", x.pid), events.F("status", status))
	if x.err != nil && j.done == nil {
		fmt.Fprintf(j.out, "worker %d (pid %d) ended: %s\n", x.index, x.pid, status)
	}
}

// generation reports a new generation: who is in the ring, who was lost and
// who joined.
func (j *job) generation(g *phalanxpb.Generation) {
	j.gen = g
	if j.first == 0 {
		j.first = g.Number
	}
	if g.Stopped {
		j.stopped = g.Reason
		j.ev.Emit("generation", events.F("generation", g.Number), events.F("members", []any{}), events.F("world", 0), events.F("reason", g.Reason))
		fmt.Fprintf(j.out, "generation %d: job stopped: %s\n", g.Number, g.Reason)
		return
	}
	members := make([]map[string]any, len(g.Members))
	pos := map[string]int{}
	for i, m := range g.Members {
		members[i] = map[string]any{"rank": i, "id": m.Id, "pid": m.Pid}
		pos[m.Id] = i
	}
	j.ev.Emit("generation", events.F("generation", g.Number), events.F("members", members), events.F("world", len(g.Members)),
		events.F("reason", g.Reason), events.F("decided_by", g.DecidedBy))
	for _, l := range g.Lost {
		j.ev.Emit("worker_lost", events.F("generation", g.Number), events.F("rank", l.Rank), events.F("pid", l.Pid), events.F("id", l.Id), events.F("detected_by", l.DetectedBy))
	}
	for _, x := range g.Excluded {
		j.ev.Emit("straggler_excluded", events.F("generation", g.Number), events.F("rank", x.Rank), events.F("pid", x.Pid), events.F("id", x.Id),
			events.F("late_in", x.LateIn), events.F("window", x.Window), events.F("step", x.Step))
	}
	for _, id := range g.Readmitted {
		i := pos[id]
		j.ev.Emit("straggler_readmitted", events.F("generation", g.Number), events.F("rank", i), events.F("pid", g.Members[i].Pid), events.F("id", id))
	}
	for _, id := range g.Joined {
		if g.Number == j.first {
			break
		}
		i := pos[id]
		j.ev.Emit("worker_joined", events.F("generation", g.Number), events.F("rank", i), events.F("pid", g.Members[i].Pid), events.F("id", id))
	}
	fmt.Fprintf(j.out, "generation %d: %d workers (%s)\n", g.Number, len(g.Members), g.Reason)
}

// handle takes one report line of a worker.
func (j *job) handle(l procLine) error {
	var r report
	if err := json.Unmarshal(l.line, &r); err != nil {
		return fmt.Errorf("worker %d printed %q: %w", l.index, l.line, err)
	}
	switch r.Kind {
	case "registered":
		j.byPid[int64(r.Pid)] = l.index
	case "restored":
		if j.first != 0 && r.Generation > j.first {
			j.ev.Emit("restored", events.F("generation", r.Generation), events.F("world", r.World), events.F("step", r.Step),
				events.F("steps_redone", r.Redone), events.F("root", r.Root))
			fmt.Fprintf(j.out, "generation %d: resumed at step %d on %d workers, %d steps redone\n", r.Generation, r.Step, r.World, r.Redone)
		}
	case "step":
		if r.Generation < j.stepGen || (r.Replayed && r.Step <= j.lastStep) {
			return nil // from a rank 0 of a ring that steps no more, or already reported
		}
		j.stepGen, j.lastStep = r.Generation, r.Step
		j.ev.Emit("step", events.F("step", r.Step), events.F("generation", r.Generation), events.F("world", r.World),
			events.F("loss", r.Loss), events.F("samples_per_s", r.SamplesPS),
			events.F("step_s", r.StepS), events.F("compute_s", r.ComputeS), events.F("comm_s", r.CommS),
			events.F("epoch", r.Epoch), events.F("offset", r.Offset), events.F("fingerprint", r.Fingerprint),
			events.F("participants", cmp.Or(r.Participants, r.World)), events.F("stale", r.Stale))
		if r.Step%j.every == 0 || r.Step == j.c.train.steps {
			elapsed := time.Since(j.start)
			eta := time.Duration(float64(elapsed) / float64(r.Step) * float64(j.c.train.steps-r.Step))
			fmt.Fprintf(j.out, "step %*d/%d  loss %.4f  acc %5.1f%%  %8.0f samples/s  %d workers  ETA %s\n",
				len(strconv.FormatInt(j.c.train.steps, 10)), r.Step, j.c.train.steps, r.Loss, 100*r.Accuracy, r.SamplesPS, r.World, eta.Round(time.Second))
		}
	case "restart":
		j.ev.Emit("rank_restarted", events.F("rank", r.Rank), events.F("committed_step", r.Step),
			events.F("reason", r.Reason), events.F("restarts", r.Restarts))
		fmt.Fprintf(j.out, "rank %d restarted by its supervisor (%s); resumed from the commit of step %d\n", r.Rank, r.Reason, r.Step)
	case "checkpoint":
		j.checkpointEvent(r.Checkpoint)
	case "fed":
		j.ev.Emit("straggler_fed", events.F("id", r.ID), events.F("step", r.Step))
	case "stopped":
		if j.stop == nil {
			j.stop = &r
			j.ev.Emit("stopped", events.F("step", r.Step), events.F("generation", r.Generation), events.F("world", r.World))
		}
	case "done":
		if j.done == nil {
			j.done = &r
			j.ev.Emit("done", events.F("step", r.Step), events.F("accuracy", r.Accuracy), events.F("loss", r.Loss),
				events.F("generation", r.Generation), events.F("world", r.World), events.F("parameters_identical", r.Identical != nil && *r.Identical))
		}
	}
	return nil
}

// faultyModel panics once in model code at a chosen step: the --fail-at
// fault injection, to watch a rank actor's restart.
type faultyModel struct {
	*mlp.Model
	trainer *worker.Trainer
	at      int64
	times   int // failures left
}

func (f *faultyModel) Step(b *worker.Batch, scale float32, ready func(int)) (worker.Result, error) {
	if f.trainer.NextStep() == f.at && f.times > 0 {
		f.times--
		panic(fmt.Sprintf("fault injected by --fail-at at step %d", f.at))
	}
	return f.Model.Step(b, scale, ready)
}

// injectedModel slows down or pauses the model code of a ring rank: the
// --inject-slow and --inject-pause fault injection, for stragglers in tests
// and benchmarks. Sleeping is the fault here, not a synchronisation.
type injectedModel struct {
	worker.Model
	in      failure.Injection
	trainer *worker.Trainer
	paused  int64 // the step already paused at
	// probeStep, when not 0, is the ring's step while this worker is
	// excluded and times its own steps: the injection follows the ring.
	probeStep *atomic.Int64
}

func (m *injectedModel) Step(b *worker.Batch, scale float32, ready func(int)) (worker.Result, error) {
	rank, step := m.trainer.Group().Rank(), m.trainer.NextStep()
	if m.probeStep != nil {
		if s := m.probeStep.Load(); s > 0 {
			step = s
		}
	}
	if d := m.in.PauseAt(rank, step); d > 0 && m.paused != step {
		m.paused = step
		time.Sleep(d)
	}
	start := time.Now()
	res, err := m.Model.Step(b, scale, ready)
	if f := m.in.Factor(rank, step); f > 1 {
		time.Sleep(time.Duration(float64(time.Since(start)) * (f - 1)))
	}
	return res, err
}

func loadMLPData(c trainFlags) (train, test *mlp.Data, err error) {
	if c.dataDir != "" {
		return mlp.LoadMNIST(c.dataDir)
	}
	if train, err = mlp.Synthetic(c.samples, 784, 10, c.seed, 1); err != nil {
		return nil, nil, err
	}
	test, err = mlp.Synthetic(10000, 784, 10, c.seed, 2)
	return train, test, err
}

// evaluate scores the model on every rank's share of data and combines them.
func evaluate(ctx context.Context, g *collective.Group, m worker.Evaluator, data *mlp.Data) (loss, acc float64, err error) {
	lo, hi := collective.ShardRange(data.Len(), g.Size(), g.Rank())
	var b worker.Batch
	idx := make([]int, 0, 1000)
	sums := make([]float64, 2)
	for a := lo; a < hi; a += 1000 {
		idx = idx[:0]
		for i := a; i < min(a+1000, hi); i++ {
			idx = append(idx, i)
		}
		if err := data.Fill(idx, &b); err != nil {
			return 0, 0, err
		}
		r, err := m.Evaluate(&b)
		if err != nil {
			return 0, 0, err
		}
		sums[0] += r.LossSum
		sums[1] += float64(r.Correct)
	}
	if err := g.AllReduce(ctx, collective.Float64s(sums), collective.Sum); err != nil {
		return 0, 0, fmt.Errorf("evaluation: %w", err)
	}
	n := float64(data.Len())
	return sums[0] / n, sums[1] / n, nil
}
