package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/elastic"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/examples/mlp"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

// report is a line a worker prints on stdout for its launcher; rank 0 of
// each generation reports the job's progress.
type report struct {
	Kind         string            `json:"kind"` // registered, restored, step, restart or done
	ID           string            `json:"id,omitempty"`
	Pid          int               `json:"pid,omitempty"`
	Step         int64             `json:"step"`
	Generation   uint64            `json:"generation"`
	World        int               `json:"world"`
	Rank         int               `json:"rank"`
	Loss         float64           `json:"loss"`
	Accuracy     float64           `json:"accuracy"`
	SamplesPS    float64           `json:"samples_per_s"`
	ComputeS     float64           `json:"compute_s"`
	CommS        float64           `json:"comm_s"`
	StepS        float64           `json:"step_s"`
	Epoch        int64             `json:"epoch"`
	Offset       int64             `json:"offset"`
	Fingerprint  [5]float64        `json:"fingerprint"`
	Redone       int64             `json:"steps_redone"`
	Root         int               `json:"root"`
	Reason       string            `json:"reason,omitempty"`
	Restarts     int               `json:"restarts,omitempty"`
	Replayed     bool              `json:"replayed,omitempty"`     // a step report repeated after a ring change
	Identical    *bool             `json:"identical,omitempty"`    // done: every rank ends with bitwise the same parameters
	Participants int               `json:"participants,omitempty"` // ranks whose gradients entered the step's update
	Stale        int               `json:"stale,omitempty"`        // ranks whose gradients missed the step
	Checkpoint   *checkpoint.Event `json:"checkpoint,omitempty"`
}

// reporter writes report lines; the rank and group actors both do.
type reporter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (r *reporter) send(rep report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.enc.Encode(rep)
}

type workerConfig struct {
	train    trainFlags
	member   membershipFlags
	bind     string
	rankHint int
	index    int
	threads  int
	logLevel string
	hash     string
	// the hashes a checkpoint records
	ckptConfigHash, ckptStateHash string
}

func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("worker",
		"Runs one elastic worker of a training job: it registers in etcd (--etcd-endpoints), trains in\n"+
			"every generation the coordinator puts it in, and survives the loss or arrival of other workers.\n"+
			"Start one per host or GPU slot with the same training flags; \"phalanx train\" starts them for you.\n"+
			"Prints one JSON report per line on stdout (for its launcher).", stderr)
	var c workerConfig
	c.train.register(fs)
	c.member.register(fs)
	fs.StringVar(&c.bind, "bind", "127.0.0.1:0", "data-plane listen address (host:port; port 0 picks one); the control plane listens on the same host")
	fs.IntVar(&c.rankHint, "rank-hint", -1, "preferred place in the first ring (-1: none)")
	fs.IntVar(&c.index, "worker-index", -1, "this worker's index among those its launcher started (for --fail-at)")
	fs.IntVar(&c.threads, "threads", 0, "OS threads running Go code (GOMAXPROCS); 0 = all cores")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.train.check(); err != nil {
		return err
	}
	if err := c.member.check(); err != nil {
		return err
	}
	switch {
	case c.member.endpoints == "":
		return usagef("--etcd-endpoints is required: a worker joins a job through its etcd")
	case c.member.job == "":
		return usagef("--job is required")
	case c.train.rescale == "lr" && c.train.refWorld < 1:
		return usagef("--rescale lr needs --reference-world")
	case c.threads < 0:
		return usagef("--threads %d: must not be negative", c.threads)
	}
	c.hash = configHash(fs)
	c.ckptConfigHash, c.ckptStateHash = checkpointHashes(fs)
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	if c.threads > 0 {
		runtime.GOMAXPROCS(c.threads)
	}
	return workerMain(ctx, c, stdout, log)
}

// workerMain is one worker process: a data-plane endpoint, an actor system
// whose supervisor owns the group actor and each round's rank actor, and the
// elastic agent that moves them from generation to generation.
func workerMain(ctx context.Context, c workerConfig, stdout io.Writer, log *zap.Logger) error {
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
	defer sys.Quiet()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.member.endpointList(), DialTimeout: 5 * time.Second, Logger: log.Named("etcd")})
	if err != nil {
		return fmt.Errorf("etcd %s: %w", c.member.endpoints, err)
	}
	defer cli.Close()
	keys, err := coordinator.KeysFor(c.member.job)
	if err != nil {
		return usagef("--job: %v", err)
	}
	train, test, err := loadMLPData(c.train)
	if err != nil {
		return err
	}
	w := &elasticWorker{feeds: map[string]*phalanxpb.FeedRequest{}}
	var store checkpoint.Store
	if c.train.ckpt.url != "" {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		store, err = checkpoint.OpenURL(sctx, c.train.ckpt.url, checkpoint.Credentials{})
		cancel()
		if err != nil {
			return fmt.Errorf("--checkpoint: %w", err)
		}
		// SIGTERM or SIGINT asks for a final checkpoint and a stop at the next
		// step boundary (graceful preemption); a second signal, or no step
		// boundary within the wait bound, ends the worker at once.
		parent := ctx
		var cancelRun context.CancelCauseFunc
		ctx, cancelRun = context.WithCancelCause(context.WithoutCancel(parent))
		defer cancelRun(nil)
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
		defer signal.Stop(sigs)
		go func() {
			select {
			case s := <-sigs:
				log.Warn("asked to stop: final checkpoint at the next step boundary", zap.Stringer("signal", s))
				w.stopAsked.Store(true)
				if ck := w.checkpointer(); ck != nil {
					ck.RequestStop()
				}
				t := time.NewTimer(c.train.ckpt.wait + 30*time.Second)
				defer t.Stop()
				select {
				case s = <-sigs:
					cancelRun(fmt.Errorf("stopped by a second %v", s))
				case <-t.C:
					cancelRun(fmt.Errorf("asked to stop and no step boundary came within %v", c.train.ckpt.wait+30*time.Second))
				case <-ctx.Done():
				}
			case <-ctx.Done():
			}
		}()
	}
	rep := &reporter{enc: json.NewEncoder(stdout)}
	done := make(chan error, 1)
	strategy := &actors.Strategy{Budget: c.train.budget, Logger: log, GiveUp: func(e *actors.GiveUpError) {
		select {
		case done <- e:
		default:
		}
	}}
	var policy *hybrid.Policy
	if c.train.sync.mode == "hybrid" {
		policy = &c.train.sync.policy
	}
	sup, pids, err := actors.StartSupervisor(sys, "job", strategy, actors.Child{Name: "group", Props: worker.NewGroupProps(worker.GroupConfig{
		Logger: log,
		Hybrid: policy,
		OnExclude: func(e worker.Exclusion) {
			id := e.ID
			x := &phalanxpb.Exclusion{Id: id, Generation: w.generation.Load(), LateIn: int32(e.LateIn), Window: int32(e.Window), Step: e.Step,
				RequestedBy: w.id, RequestedUnixNano: time.Now().UnixNano(), DeadlineNanos: int64(e.Deadline), OverheadNanos: int64(e.Overhead)}
			log.Warn("excluding a straggler", zap.String("worker", id), zap.Int("late_in", e.LateIn), zap.Int("window", e.Window),
				zap.Duration("deadline", e.Deadline), zap.Duration("overhead", e.Overhead))
			go func() { // not on the group actor's goroutine
				ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if err := coordinator.Exclude(ectx, cli, keys, x); err != nil {
					log.Warn("asking the coordinator to exclude a straggler", zap.String("worker", id), zap.Error(err))
				}
			}()
		},
		OnPace: func(deadline, overhead time.Duration) {
			w.paceDead.Store(int64(deadline))
			w.paceOver.Store(int64(overhead))
		},
		OnRestart: func(r *phalanxpb.RankRestarted) {
			rep.send(report{Kind: "restart", Rank: int(r.Rank), Step: r.CommittedStep, Reason: r.Reason, Restarts: int(r.Restarts)})
		},
	})})
	if err != nil {
		return err
	}
	groupActor := pids[0]

	agent, err := elastic.New(elastic.Config{Client: cli, Keys: keys, Job: c.member.job, Transport: tr,
		Collective: collective.Options{Timeout: c.train.timeout, Logger: log},
		DataAddr:   tr.Addr(), ControlAddr: sys.Address(), RankHint: c.rankHint, ConfigHash: c.hash,
		Capabilities: []string{"allreduce", "example:" + c.train.example},
		LeaseTTL:     c.member.leaseTTL, Unreachable: c.member.unreachable, Logger: log})
	if err != nil {
		return err
	}
	w.id, w.cli, w.keys, w.tr = agent.ID(), cli, keys, tr
	if c.train.sync.mode == "hybrid" {
		pctx, stopProbation := context.WithCancel(ctx)
		defer stopProbation() // before the etcd client closes
		go w.probation(pctx)
		go w.watchFeeds(pctx)
	}
	rep.send(report{Kind: "registered", ID: agent.ID(), Pid: os.Getpid()})
	w.c, w.log, w.sys, w.sup, w.groupActor, w.rep, w.done = c, log, sys, sup, groupActor, rep, done
	w.train, w.test, w.procCtx, w.store = train, test, ctx, store
	defer w.close()
	err = agent.Run(ctx, w.round)
	var stopped *elastic.StoppedError
	if errors.As(err, &stopped) {
		w.finalCheckpoint(ctx, cli, keys, stopped)
	}
	return err
}

// elasticWorker holds what outlives a round: the model, the optimizer, the
// trainer and its committed state.
type elasticWorker struct {
	c          workerConfig
	id         string // this worker's id in etcd
	cli        *clientv3.Client
	keys       coordinator.Keys
	tr         *collective.TCPTransport
	feedMu     sync.Mutex
	feeds      map[string]*phalanxpb.FeedRequest // excluded workers waiting for parameters (rank 0 answers)
	probeMu    sync.Mutex                        // held by a round, and by each probation step
	probeStep  atomic.Int64                      // the ring's step, for fault injection while on probation (0: not on probation)
	progressAt atomic.Int64                      // the last step written to the progress key
	paceDead   atomic.Int64                      // the group actor's next deadline and overhead (nanoseconds), for the progress key
	paceOver   atomic.Int64
	generation atomic.Uint64 // the generation it trains in
	store      checkpoint.Store
	stopAsked  atomic.Bool // a signal came before the checkpointer existed
	mu         sync.Mutex
	ckpt       *checkpoint.Checkpointer
	log        *zap.Logger
	sys        *actors.System
	sup        *actor.PID
	groupActor *actor.PID
	rep        *reporter
	done       chan error // the restart budget spent
	train      *mlp.Data
	test       *mlp.Data
	procCtx    context.Context

	model   *mlp.Model
	trainer *worker.Trainer
}

func (w *elasticWorker) close() {
	if w.trainer != nil {
		w.trainer.Close()
	}
	if ck := w.checkpointer(); ck != nil {
		ctx, cancel := context.WithTimeout(context.Background(), w.c.train.ckpt.wait)
		defer cancel()
		if err := ck.Close(ctx); err != nil {
			w.log.Warn("closing the checkpointer", zap.Error(err))
		}
	}
}

func (w *elasticWorker) checkpointer() *checkpoint.Checkpointer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ckpt
}

// newCheckpointer saves and restores the trainer's state: the parameters,
// then the optimizer's slots, the order of worker.State.
func (w *elasticWorker) newCheckpointer(params []*nn.Param, opt nn.Optimizer) (*checkpoint.Checkpointer, error) {
	var tensors []checkpoint.Tensor
	for _, p := range params {
		tensors = append(tensors, checkpoint.Tensor{Name: p.Name, Shape: shape64(p.Shape), Role: "parameter", Data: p.Value})
	}
	for _, s := range opt.Slots() {
		tensors = append(tensors, checkpoint.Tensor{Name: s.Name, Shape: shape64(s.Shape), Role: "optimizer", Data: s.Data})
	}
	k := w.c.train.ckpt
	ck, err := checkpoint.New(checkpoint.Config{Store: w.store, Job: w.c.member.job, ConfigHash: w.c.ckptConfigHash,
		StateHash: w.c.ckptStateHash, Seed: w.c.train.seed, EverySteps: k.everySteps, Every: k.every,
		Retention: checkpoint.Retention{KeepLast: k.keepLast, KeepEvery: k.keepEvery}, Wait: k.wait,
		SingleWriter: w.c.train.localSteps > 1, Logger: w.log.Named("checkpoint"),
		OnEvent: func(ev checkpoint.Event) { w.rep.send(report{Kind: "checkpoint", Checkpoint: &ev}) }}, tensors)
	if err != nil {
		return nil, err
	}
	return ck, nil
}

// finalCheckpoint: the coordinator stopped the job (too few workers) and
// the survivors have no ring to checkpoint with. Each holds the job's last
// commit; the one that claims the job's final-checkpoint key in etcd writes
// it alone.
func (w *elasticWorker) finalCheckpoint(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, stopped *elastic.StoppedError) {
	ck, t := w.checkpointer(), w.trainer
	if ck == nil || t == nil {
		return
	}
	if _, err := t.Rollback(); err != nil {
		w.log.Warn("no final checkpoint: no committed state", zap.Error(err))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.c.train.ckpt.wait)
	defer cancel()
	key := keys.FinalCheckpoint()
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, fmt.Sprintf("pid %d", os.Getpid()))).Commit()
	if err != nil || !resp.Succeeded {
		if err != nil {
			w.log.Warn("no final checkpoint: claiming it in etcd", zap.Error(err))
		}
		return
	}
	s := t.State()
	if _, err := ck.SaveAlone(ctx, checkpoint.Progress{Step: s.Step, Epoch: s.Position.Epoch, Offset: s.Position.Offset}, stopped.Generation); err != nil {
		w.log.Warn("the final checkpoint failed", zap.Error(err))
	}
}

// probation runs while this worker is excluded as a straggler: it keeps
// computing steps on its own (no update) at the ring's current step, times
// them against the deadline it missed, and asks to be readmitted once
// --readmit-after of them in a row would have met it.
func (w *elasticWorker) probation(ctx context.Context) {
	key := w.keys.Exclusion(w.id)
	for ctx.Err() == nil {
		resp, err := w.cli.Get(ctx, key)
		if err != nil {
			return
		}
		if len(resp.Kvs) == 0 { // not excluded: wait until we are
			wch := w.cli.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1))
			for wr := range wch {
				if slices.ContainsFunc(wr.Events, func(e *clientv3.Event) bool { return e.Type == clientv3.EventTypePut }) {
					break
				}
			}
			continue
		}
		var x phalanxpb.Exclusion
		if err := proto.Unmarshal(resp.Kvs[0].Value, &x); err != nil || x.DeadlineNanos <= 0 {
			w.log.Warn("an unreadable exclusion record", zap.Error(err))
			return
		}
		pr := hybrid.Probation{Deadline: time.Duration(x.DeadlineNanos), Overhead: max(0, time.Duration(x.OverheadNanos)),
			ReadmitAfter: w.c.train.sync.readmitAfter}
		w.log.Warn("excluded as a straggler: on probation", zap.Duration("deadline", pr.Deadline), zap.Duration("overhead", pr.Overhead))
		for probes := 0; ctx.Err() == nil; probes++ {
			if probes%5 == 0 { // keep receiving the ring's parameters
				if step, err := w.requestFeed(ctx); err != nil {
					w.log.Warn("receiving the ring's parameters", zap.Error(err))
				} else {
					w.rep.send(report{Kind: "fed", ID: w.id, Step: step})
				}
			}
			d, err := w.probe(ctx, &pr)
			if err != nil {
				w.log.Warn("probation step", zap.Error(err))
				return
			}
			if pr.Observe(d) {
				break
			}
		}
		w.probeStep.Store(0)
		if ctx.Err() != nil {
			return
		}
		if err := coordinator.Readmit(ctx, w.cli, w.keys, w.id); err != nil {
			w.log.Warn("asking to be readmitted", zap.Error(err))
			return
		}
		w.log.Warn("kept pace on probation: asked to be readmitted")
	}
}

// probe times one step's computation at the ring's current step, and
// updates pr to the ring's current pace.
func (w *elasticWorker) probe(ctx context.Context, pr *hybrid.Probation) (time.Duration, error) {
	w.probeMu.Lock()
	defer w.probeMu.Unlock()
	t := w.trainer
	if t == nil {
		return 0, errors.New("no trainer")
	}
	if resp, err := w.cli.Get(ctx, w.keys.Progress()); err == nil && len(resp.Kvs) == 1 {
		var p phalanxpb.Pace
		if err := proto.Unmarshal(resp.Kvs[0].Value, &p); err != nil || p.Step < 0 {
			w.log.Warn("an unreadable progress record", zap.Error(err))
		} else {
			w.probeStep.Store(p.Step)
			if p.DeadlineNanos > 0 {
				pr.Deadline, pr.Overhead = time.Duration(p.DeadlineNanos), max(0, time.Duration(p.OverheadNanos))
			}
		}
	}
	if _, err := t.Rollback(); err != nil { // the last commit: probing changes nothing
		return 0, err
	}
	start := time.Now()
	err := t.Compute(ctx)
	return time.Since(start), err
}

// parametersAgree checks that every rank holds bitwise the same parameters:
// a CRC32C of this rank's, and its negation, reduced with max, agree only if
// every rank's checksum is the same.
func parametersAgree(ctx context.Context, g *collective.Group, params []*nn.Param) (bool, error) {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, p := range params {
		h.Write(collective.Float32s(p.Value).Raw())
	}
	sum := float64(h.Sum32())
	v := []float64{sum, -sum}
	if err := g.AllReduce(ctx, collective.Float64s(v), collective.Max); err != nil {
		return false, fmt.Errorf("comparing the ranks' parameters: %w", err)
	}
	return v[0] == -v[1], nil
}

// participants is how many ranks' gradients entered a step: all of them
// but in a hybrid step that closed without some.
func participants(st worker.StepStats, world int) int {
	if st.Participants > 0 {
		return st.Participants
	}
	return world
}

func shape64(s []int) []int64 {
	out := make([]int64, len(s))
	for i, d := range s {
		out[i] = int64(d)
	}
	return out
}

// restoreIfFresh loads the newest checkpoint when no rank of the ring has
// trained yet (a job started or restarted from storage); a ring with any
// trained state resumes from memory instead, which is never older.
func (w *elasticWorker) restoreIfFresh(ctx context.Context, g *collective.Group) (restored bool, err error) {
	t := w.trainer
	committed, _ := t.State().Committed()
	v := []float64{float64(committed)}
	if err := g.AllReduce(ctx, collective.Float64s(v), collective.Max); err != nil {
		return false, fmt.Errorf("checking for trained state: %w", err)
	}
	if v[0] > 0 {
		return false, nil
	}
	res, err := w.ckpt.Restore(ctx, w.c.train.ckpt.resume)
	if err != nil || res == nil {
		return false, err
	}
	m := res.Manifest
	return true, t.Restored(m.Step, worker.Position{Epoch: m.Epoch, Offset: m.Offset})
}

// setup builds the model and trainer in the first round this worker trains.
func (w *elasticWorker) setup(g *collective.Group) error {
	c := w.c.train
	m, err := mlp.New(append(append([]int{w.train.Features}, c.hidden...), w.train.Classes), c.seed)
	if err != nil {
		return err
	}
	var model worker.Model = m
	var faulty *faultyModel
	if c.failWorker >= 0 && c.failWorker == w.c.index {
		faulty = &faultyModel{Model: m, at: c.failStep, times: c.failTimes}
		model = faulty
	}
	var inj *injectedModel
	if len(c.inject.Slow)+len(c.inject.Pause) > 0 {
		inj = &injectedModel{Model: model, in: c.inject, paused: -1}
		model = inj
	}
	opt, err := nn.NewOptimizer(c.opt, model.Params())
	if err != nil {
		return err
	}
	cfg := worker.Config{GlobalBatch: c.batch, MicroBatches: c.micro, LocalSteps: c.localSteps, ClipNorm: c.clip,
		CommitEvery: c.commitEvery, BucketBytes: c.bucket, Schedule: c.sched, Seed: c.seed,
		KeepRankBatch: c.rescale == "lr", ReferenceWorld: c.refWorld, StaleDecay: c.sync.staleDecay}
	if c.sync.stale == "decay" {
		cfg.Stale = worker.StaleDecay
	}
	t, err := worker.NewTrainer(w.procCtx, g, model, w.train, opt, cfg, w.log)
	if err != nil {
		return err
	}
	if faulty != nil {
		faulty.trainer = t
	}
	if inj != nil {
		inj.trainer = t
		inj.probeStep = &w.probeStep
	}
	t.State().Commit() // step 0: a candidate like any other, the same on every fresh worker
	w.model, w.trainer = m, t
	if w.store != nil {
		ck, err := w.newCheckpointer(model.Params(), opt)
		if err != nil {
			return err
		}
		t.SetVoter(ck.Votes)
		w.mu.Lock()
		w.ckpt = ck
		w.mu.Unlock()
		if w.stopAsked.Load() { // a signal that came before ck was published
			ck.RequestStop()
		}
	}
	return nil
}

// round trains in one generation: roll back to the last commit, move to the
// new ring, resync from the newest commit, then run the step protocol until
// the job's last step, the end of the round, or a failure.
func (w *elasticWorker) round(ctx context.Context, r *elastic.Round) error {
	w.probeMu.Lock() // no probation step while in a ring
	defer w.probeMu.Unlock()
	g, gen := r.Group, r.Generation
	var reached int64
	if w.trainer == nil {
		if err := w.setup(g); err != nil {
			return err
		}
	} else {
		reached = w.trainer.State().Step
		if _, err := w.trainer.Rollback(); err != nil {
			return err
		}
		if err := w.trainer.Rebind(g); err != nil {
			return err
		}
	}
	t := w.trainer
	restored := false
	if w.ckpt != nil {
		w.ckpt.Bind(checkpoint.Ring{Group: g, Generation: gen.Number, Decided: gen.DecidedUnixNano})
		var err error
		if restored, err = w.restoreIfFresh(ctx, g); err != nil {
			return err
		}
	}
	// After a restore every rank holds the same state (each rank restores
	// when any does): nothing to resynchronise.
	res := worker.Resynced{Step: t.State().Step}
	if !restored {
		var err error
		if res, err = t.Resync(ctx, reached); err != nil {
			return err
		}
	}
	world := 0
	if r.Rank == 0 {
		world = g.Size()
		w.rep.send(report{Kind: "restored", Generation: gen.Number, World: g.Size(), Step: res.Step, Redone: res.Redone, Root: res.Root})
		if l := res.Last; l.Step > 0 && l.Step == res.Step { // in case the previous reporter never saw it
			w.rep.send(report{Kind: "step", Replayed: true, Step: l.Step, Generation: gen.Number, World: g.Size(), Loss: l.Loss,
				Accuracy: l.Accuracy, Epoch: l.Position.Epoch, Offset: l.Position.Offset, Fingerprint: l.Fingerprint})
		}
	}
	w.generation.Store(gen.Number)
	ids := make([]string, len(gen.Members))
	for i, m := range gen.Members {
		ids[i] = m.Id
	}
	w.sys.Root.Send(w.groupActor, &worker.GroupRound{Generation: gen.Number, World: world, Members: ids})

	finished := make(chan error, 1)
	prev := time.Now()
	props := worker.NewRankProps(worker.RankConfig{
		Trainer: t, Rank: r.Rank, Generation: gen.Number, Steps: w.c.train.steps, Context: ctx, Logger: w.log,
		Hybrid: w.c.train.sync.mode == "hybrid",
		Group:  actors.Ref(gen.Members[0].ControlAddr, "job/group"),
		OnDone: func(err error) { finished <- err },
		AfterStep: func(st worker.StepStats) (bool, error) {
			if w.ckpt == nil {
				return false, nil
			}
			return w.ckpt.AfterStep(ctx, checkpoint.Progress{Step: st.Step, Epoch: st.Position.Epoch, Offset: st.Position.Offset,
				Loss: st.Loss, Accuracy: st.Accuracy, Samples: int64(st.Samples)}, st.Votes, st.Step >= w.c.train.steps)
		},
		OnStep: func(st worker.StepStats) {
			now := time.Now()
			if r.Rank == 0 && w.c.train.sync.mode == "hybrid" && st.Step-w.progressAt.Load() >= 5 {
				w.progressAt.Store(st.Step)
				pace, _ := proto.Marshal(&phalanxpb.Pace{Step: st.Step, DeadlineNanos: w.paceDead.Load(), OverheadNanos: w.paceOver.Load()})
				go func() { // the pace excluded workers measure themselves against
					pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					defer cancel()
					w.cli.Put(pctx, w.keys.Progress(), string(pace))
				}()
			}
			if r.Rank == 0 && w.c.train.sync.mode == "hybrid" {
				w.serveFeeds(ctx, w.model.Params(), st.Step)
			}
			if r.Rank == 0 {
				w.rep.send(report{Kind: "step", Step: st.Step, Generation: gen.Number, World: g.Size(), Loss: st.Loss,
					Accuracy: st.Accuracy, SamplesPS: float64(st.Samples) / now.Sub(prev).Seconds(),
					ComputeS: st.Compute.Seconds(), CommS: st.Comm.Seconds(), StepS: now.Sub(prev).Seconds(),
					Epoch: st.Position.Epoch, Offset: st.Position.Offset, Fingerprint: st.Fingerprint,
					Participants: participants(st, g.Size()), Stale: g.Size() - participants(st, g.Size())})
			}
			prev = now
		},
	})
	pid, err := actors.SpawnChild(ctx, w.sys, w.sup, actors.Child{Name: fmt.Sprintf("rank-g%d", gen.Number), Props: props})
	if err != nil {
		return err
	}
	select {
	case err = <-finished:
	case err = <-w.done:
	case <-g.Failed():
		err = g.Err()
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	stopped := errors.Is(err, worker.ErrStopped)
	if stopped {
		err = nil
	}
	if err != nil {
		g.Abort(err.Error())
	}
	if serr := actors.StopChild(w.sys, pid); serr != nil {
		w.log.Warn("stopping the rank actor", zap.Error(serr))
	}
	if err != nil {
		return err
	}
	if stopped {
		if r.Rank == 0 {
			w.rep.send(report{Kind: "stopped", Step: t.State().Step, Generation: gen.Number, World: g.Size()})
		}
		w.sys.Quiet()
		return nil // every rank stops at this boundary: the job is over for now
	}
	loss, acc, err := evaluate(ctx, g, w.model, w.test)
	if err != nil {
		return err
	}
	same, err := parametersAgree(ctx, g, w.model.Params())
	if err != nil {
		return err
	}
	if r.Rank == 0 {
		w.rep.send(report{Kind: "done", Step: t.State().Step, Generation: gen.Number, World: g.Size(), Loss: loss, Accuracy: acc,
			Identical: &same})
	}
	w.sys.Quiet()         // peers' control planes go away from here on
	return g.Barrier(ctx) // no worker leaves while another still evaluates
}
