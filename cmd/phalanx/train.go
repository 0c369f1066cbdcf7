package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/examples/mlp"
	"github.com/phalanx-rt/phalanx/internal/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

type trainConfig struct {
	example     string
	workers     int
	steps       int64
	batch       int
	opt         nn.OptimizerConfig
	sched       nn.Schedule
	clip        float64
	micro       int
	localSteps  int
	commitEvery int
	bucket      int
	seed        uint64
	hidden      []int
	samples     int
	dataDir     string
	eventsPath  string
	threads     int
	timeout     time.Duration
	asRank      int
	bind        string
	logLevel    string
	failRank    int
	failStep    int64
	failTimes   int
	budget      actors.Budget
	rawArgs     []string
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("train",
		"Trains an example model data-parallel on --workers local worker processes (one rank each, over\n"+
			"loopback TCP), like torchrun --standalone. Shows progress (step, loss, samples/s, ETA) and ends\n"+
			"with the final loss and the accuracy on held-out data.", stderr)
	var c trainConfig
	fs.StringVar(&c.example, "example", "mlp", "example to train: mlp")
	fs.IntVar(&c.workers, "workers", 2, "worker processes (ranks), 1..64")
	fs.Int64Var(&c.steps, "steps", 300, "the job's total number of steps")
	fs.IntVar(&c.batch, "batch", 256, "global batch: samples per step across all workers")
	fs.StringVar(&c.opt.Kind, "optimizer", "momentum", "optimizer: sgd, momentum, adam or adamw")
	fs.Float64Var(&c.sched.Base, "lr", 0.05, "base learning rate")
	fs.Float64Var(&c.opt.Momentum, "momentum", 0.9, "momentum factor (optimizer momentum)")
	fs.BoolVar(&c.opt.Nesterov, "nesterov", false, "Nesterov momentum")
	fs.Float64Var(&c.opt.WeightDecay, "weight-decay", 0, "weight decay (L2; decoupled for adamw)")
	fs.StringVar(&c.sched.Kind, "schedule", "cosine", "learning-rate schedule after warm-up: constant, step or cosine (to 0 at --steps)")
	fs.Int64Var(&c.sched.Warmup, "warmup", 10, "linear warm-up steps")
	fs.Int64Var(&c.sched.Every, "decay-every", 100, "step schedule: decay period in steps")
	fs.Float64Var(&c.sched.Gamma, "decay-factor", 0.1, "step schedule: factor applied every --decay-every steps")
	fs.Float64Var(&c.clip, "clip", 0, "clip gradients to this global L2 norm (0: off)")
	fs.IntVar(&c.micro, "micro-batches", 1, "gradient accumulation: micro-batches per worker per step, one allreduce per step")
	fs.IntVar(&c.localSteps, "local-steps", 1, "1: average gradients every step; K > 1: local SGD, average parameters every K steps")
	fs.IntVar(&c.commitEvery, "commit-every", 1, "commit the training state in memory every this many steps")
	bucket := fs.String("bucket", "1MiB", "gradient fusion bucket size")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the weights, the synthetic data and the shuffle")
	hidden := fs.String("hidden", "512,512", "mlp: comma-separated hidden layer widths")
	fs.IntVar(&c.samples, "samples", 60000, "mlp: synthetic training samples (a further 10000 are held out)")
	fs.StringVar(&c.dataDir, "data", "", "mlp: directory with MNIST's IDX files instead of the synthetic task")
	fs.StringVar(&c.eventsPath, "events", "", "write the job's events as JSON lines to this file (see docs/events.md)")
	fs.IntVar(&c.threads, "threads", 0, "OS threads running Go code in each worker (GOMAXPROCS); 0 = cores/workers, at least 1")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline of every collective operation")
	fs.IntVar(&c.asRank, "as-rank", -1, "internal: run as this rank of a job launched by phalanx train")
	fs.StringVar(&c.bind, "bind", "127.0.0.1:0", "with --as-rank: data-plane listen address")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	failAt := fs.String("fail-at", "", "fault injection: RANK:STEP makes that rank's model code panic once at that step;\nits supervisor restarts the rank actor, which resumes from its commit")
	fs.IntVar(&c.failTimes, "fail-times", 1, "fault injection: how many times in a row --fail-at fails")
	c.budget = actors.DefaultBudget()
	fs.IntVar(&c.budget.MaxRestarts, "max-restarts", c.budget.MaxRestarts, "restart budget: a rank actor failing more often than this within --restart-window ends the job")
	fs.DurationVar(&c.budget.Window, "restart-window", c.budget.Window, "restart budget window")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var err error
	c.failRank = -1
	if *failAt != "" {
		r, st, ok := strings.Cut(*failAt, ":")
		rank, err1 := strconv.Atoi(r)
		step, err2 := strconv.ParseInt(st, 10, 64)
		if !ok || err1 != nil || err2 != nil || rank < 0 || rank >= c.workers || step < 1 {
			return usagef("--fail-at %q: want RANK:STEP with a rank below --workers and a step from 1", *failAt)
		}
		c.failRank, c.failStep = rank, step
	}
	if c.budget.MaxRestarts < 0 || c.budget.Window <= 0 {
		return usagef("--max-restarts must not be negative and --restart-window must be positive")
	}
	switch {
	case c.example != "mlp":
		return usagef("--example %q: the examples are: mlp", c.example)
	case c.workers < 1 || c.workers > 64:
		return usagef("--workers %d: want 1..64", c.workers)
	case c.steps < 1:
		return usagef("--steps %d: want at least 1", c.steps)
	case c.batch < 1:
		return usagef("--batch %d: want at least 1", c.batch)
	case c.micro < 1 || c.localSteps < 1 || c.commitEvery < 1:
		return usagef("--micro-batches, --local-steps and --commit-every must be at least 1")
	case c.threads < 0:
		return usagef("--threads %d: must not be negative", c.threads)
	case c.samples < 1:
		return usagef("--samples %d: want at least 1", c.samples)
	case c.timeout <= 0:
		return usagef("--timeout %v: must be positive", c.timeout)
	}
	if c.bucket, err = parseSize(*bucket); err != nil || c.bucket < 1 {
		return usagef("--bucket %q: want a size such as 1MiB", *bucket)
	}
	if c.hidden, err = parseWidths(*hidden); err != nil {
		return usagef("--hidden: %v", err)
	}
	if c.sched.Kind == "cosine" {
		c.sched.Total = max(c.steps, c.sched.Warmup+1)
	}
	if err := c.sched.Validate(); err != nil {
		return usagef("learning rate: %v", err)
	}
	if _, err := nn.NewOptimizer(c.opt, nil); err != nil {
		return usagef("--optimizer: %v", err)
	}
	c.rawArgs = args
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	if c.asRank >= 0 {
		return trainRank(ctx, c, stdout, log)
	}
	return trainJob(ctx, c, stdout, stderr)
}

func parseWidths(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || w < 1 {
			return nil, fmt.Errorf("width %q: want a positive integer", f)
		}
		out = append(out, w)
	}
	return out, nil
}

// report is a line from rank 0 to the launcher.
type report struct {
	Kind       string  `json:"kind"` // step or done
	Step       int64   `json:"step"`
	Generation uint64  `json:"generation"`
	World      int     `json:"world"`
	Loss       float64 `json:"loss"`
	Accuracy   float64 `json:"accuracy"`
	SamplesPS  float64 `json:"samples_per_s"`
	ComputeS   float64 `json:"compute_s"`
	CommS      float64 `json:"comm_s"`
	StepS      float64 `json:"step_s"`
	Rank       int     `json:"rank,omitempty"`
	Reason     string  `json:"reason,omitempty"`
	Restarts   int     `json:"restarts,omitempty"`
}

// trainJob launches the workers and follows rank 0's reports.
func trainJob(ctx context.Context, c trainConfig, stdout, stderr io.Writer) error {
	var ev *events.Log
	if c.eventsPath != "" {
		f, err := os.OpenFile(c.eventsPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("--events: %w", err)
		}
		defer f.Close()
		ev = events.New(f, nil)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	procs, err := launch.Start(startCtx, c.workers, func(rank int) *exec.Cmd {
		args := append([]string{"train"}, c.rawArgs...)
		args = append(args, "--as-rank", strconv.Itoa(rank))
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stderr = stderr
		return cmd
	})
	if err != nil {
		return err
	}
	defer launch.Kill(procs)
	for _, p := range procs {
		data, _, err := parseAnnouncement(p.Addr)
		if err != nil {
			return fmt.Errorf("rank %d: %w", p.Rank, err)
		}
		ev.Emit("worker_started", events.F("rank", p.Rank), events.F("pid", p.Pid()), events.F("addr", data))
	}
	fmt.Fprintf(stdout, "phalanx train: %s on %d workers, %d steps, global batch %d\n", c.example, c.workers, c.steps, c.batch)
	start := time.Now()
	every := max(1, c.steps/20)
	var done *report
	sc := bufio.NewScanner(procs[0].Out)
	for sc.Scan() {
		var r report
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("rank 0 printed %q: %w", sc.Text(), err)
		}
		switch r.Kind {
		case "step":
			ev.Emit("step", events.F("step", r.Step), events.F("generation", r.Generation), events.F("world", r.World),
				events.F("loss", r.Loss), events.F("samples_per_s", r.SamplesPS),
				events.F("step_s", r.StepS), events.F("compute_s", r.ComputeS), events.F("comm_s", r.CommS))
			if r.Step%every == 0 || r.Step == c.steps {
				elapsed := time.Since(start)
				eta := time.Duration(float64(elapsed) / float64(r.Step) * float64(c.steps-r.Step))
				fmt.Fprintf(stdout, "step %*d/%d  loss %.4f  acc %5.1f%%  %8.0f samples/s  ETA %s\n",
					len(strconv.FormatInt(c.steps, 10)), r.Step, c.steps, r.Loss, 100*r.Accuracy, r.SamplesPS, eta.Round(time.Second))
			}
		case "restart":
			ev.Emit("rank_restarted", events.F("rank", r.Rank), events.F("committed_step", r.Step),
				events.F("reason", r.Reason), events.F("restarts", r.Restarts))
			fmt.Fprintf(stdout, "rank %d restarted by its supervisor (%s); resumed from the commit of step %d\n", r.Rank, r.Reason, r.Step)
		case "done":
			done = &r
			ev.Emit("done", events.F("step", r.Step), events.F("accuracy", r.Accuracy), events.F("loss", r.Loss))
		}
	}
	var failed error
	for _, p := range procs {
		p.In.Close()
		if err := p.Cmd.Wait(); err != nil {
			failed = errors.Join(failed, fmt.Errorf("worker rank %d (pid %d): %w", p.Rank, p.Pid(), err))
		}
	}
	if failed != nil {
		return failed
	}
	if done == nil {
		return fmt.Errorf("rank 0 ended without a result")
	}
	fmt.Fprintf(stdout, "done: %d steps in %s; held-out loss %.4f, accuracy %.2f%%\n",
		done.Step, time.Since(start).Round(time.Millisecond), done.Loss, 100*done.Accuracy)
	return nil
}

// reporter writes rank 0's report lines; the rank and group actors both do.
type reporter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (r *reporter) send(rep report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.enc.Encode(rep)
}

// announcement is what a worker tells the launcher: its data-plane and
// control-plane addresses.
func announcement(data, control string) string { return data + "|" + control }

func parseAnnouncement(s string) (data, control string, err error) {
	data, control, ok := strings.Cut(s, "|")
	if !ok || data == "" || control == "" {
		return "", "", fmt.Errorf("worker address %q: want data|control", s)
	}
	return data, control, nil
}

// trainRank is one worker process: a data-plane endpoint, an actor system
// whose supervisor owns this rank's actor (and, on rank 0, the group actor),
// and the trainer they drive.
func trainRank(ctx context.Context, c trainConfig, stdout io.Writer, log *zap.Logger) error {
	runtime.GOMAXPROCS(launch.ThreadsPerRank(c.threads, c.workers))
	log = log.With(zap.Int("rank", c.asRank))
	tr, err := collective.ListenTCP(collective.TCPOptions{Bind: c.bind, Logger: log})
	if err != nil {
		return err
	}
	defer tr.Close()
	host, _, err := net.SplitHostPort(tr.Addr())
	if err != nil {
		return err
	}
	sys, err := actors.NewSystem(actors.Options{Logger: log, Remote: true, Bind: net.JoinHostPort(host, "0")})
	if err != nil {
		return err
	}
	defer sys.Shutdown()
	list, err := launch.Announce(stdout, bufio.NewReader(os.Stdin), announcement(tr.Addr(), sys.Address()))
	if err != nil {
		return err
	}
	peers := make([]string, len(list))
	var control0 string
	for i, a := range list {
		var ctl string
		if peers[i], ctl, err = parseAnnouncement(a); err != nil {
			return err
		}
		if i == 0 {
			control0 = ctl
		}
	}
	train, test, err := loadMLPData(c)
	if err != nil {
		return err
	}
	m := collective.Membership{Job: "train", Generation: 1, Rank: c.asRank, Peers: peers}
	g, err := collective.Join(ctx, tr, m, collective.Options{Timeout: c.timeout, Logger: log})
	if err != nil {
		return err
	}
	defer g.Close()
	mlpModel, err := mlp.New(append(append([]int{train.Features}, c.hidden...), train.Classes), c.seed)
	if err != nil {
		return err
	}
	var model worker.Model = mlpModel
	var faulty *faultyModel
	if c.failRank == c.asRank && c.failStep > 0 {
		faulty = &faultyModel{Model: mlpModel, at: c.failStep, times: c.failTimes}
		model = faulty
	}
	opt, err := nn.NewOptimizer(c.opt, model.Params())
	if err != nil {
		return err
	}
	cfg := worker.Config{GlobalBatch: c.batch, MicroBatches: c.micro, LocalSteps: c.localSteps, ClipNorm: c.clip,
		CommitEvery: c.commitEvery, BucketBytes: c.bucket, Schedule: c.sched, Seed: c.seed}
	t, err := worker.NewTrainer(ctx, g, model, train, opt, cfg, log)
	if err != nil {
		return err
	}
	defer t.Close()
	if faulty != nil {
		faulty.trainer = t
	}
	if err := t.State().Sync(ctx, g, 0); err != nil {
		return err
	}
	t.State().Commit()

	rep := &reporter{enc: json.NewEncoder(stdout)}
	done := make(chan error, 2)
	prev := time.Now()
	rank := actors.Child{Name: "rank", Props: worker.NewRankProps(worker.RankConfig{
		Trainer: t, Rank: c.asRank, Generation: m.Generation, Steps: c.steps, Context: ctx, Logger: log,
		Group:  actors.Ref(control0, "job/group"),
		OnDone: func(err error) { done <- err },
		OnStep: func(st worker.StepStats) {
			now := time.Now()
			if c.asRank == 0 {
				rep.send(report{Kind: "step", Step: st.Step, Generation: m.Generation, World: g.Size(), Loss: st.Loss,
					Accuracy: st.Accuracy, SamplesPS: float64(st.Samples) / now.Sub(prev).Seconds(),
					ComputeS: st.Compute.Seconds(), CommS: st.Comm.Seconds(), StepS: now.Sub(prev).Seconds()})
			}
			prev = now
		},
	})}
	children := []actors.Child{rank}
	if c.asRank == 0 {
		children = append([]actors.Child{{Name: "group", Props: worker.NewGroupProps(worker.GroupConfig{
			World: g.Size(), Generation: m.Generation, Logger: log,
			OnRestart: func(r *phalanxpb.RankRestarted) {
				rep.send(report{Kind: "restart", Rank: int(r.Rank), Step: r.CommittedStep, Reason: r.Reason, Restarts: int(r.Restarts)})
			},
		})}}, children...)
	}
	strategy := &actors.Strategy{Budget: c.budget, Logger: log, GiveUp: func(e *actors.GiveUpError) { done <- e }}
	if _, _, err := actors.StartSupervisor(sys, "job", strategy, children...); err != nil {
		return err
	}
	select {
	case err = <-done:
	case <-g.Failed():
		err = g.Err()
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		g.Abort(err.Error())
		return err
	}
	loss, acc, err := evaluate(ctx, g, mlpModel, test)
	if err != nil {
		return err
	}
	if c.asRank == 0 {
		rep.send(report{Kind: "done", Step: t.State().Step, World: g.Size(), Loss: loss, Accuracy: acc})
	}
	sys.Quiet()
	return g.Barrier(ctx) // no rank's remote goes away while another still logs
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

func loadMLPData(c trainConfig) (train, test *mlp.Data, err error) {
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
