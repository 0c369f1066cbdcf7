package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/logical"
	"github.com/phalanx-rt/phalanx/job/pipeline/layout"
	"github.com/phalanx-rt/phalanx/job/pipeline/schedule"
	"github.com/phalanx-rt/phalanx/worker"
)

// runRole runs a pipeline worker of a registered model.
func runRole(ctx context.Context, cfg job.Config, reg *job.Registry) (*job.Result, error) {
	spec, opts, err := reg.Check(&cfg)
	if err != nil {
		return nil, err
	}
	if spec.Split != nil && cfg.Pipeline.Tensor > 0 {
		return RunTensorWorker(ctx, cfg, spec.Split, opts)
	}
	m, ok := spec.Impl.(*Model)
	if !ok {
		return nil, fmt.Errorf("pipeline: model %s is not a pipeline model (ModelSpec.Impl is %T, want *pipeline.Model)", spec.Name, spec.Impl)
	}
	return RunWorker(ctx, cfg, m, opts)
}

// RunWorker runs one worker process of a pipeline job on model m: it
// joins the job through its etcd, takes the place each generation's layout
// gives it (a stage of a replica, or a spare), and trains there until the
// job's last step.
func RunWorker(ctx context.Context, cfg job.Config, m *Model, opts job.Options) (*job.Result, error) {
	cfg.WorkerDefaults()
	shape, err := check(&cfg, m, opts)
	if err != nil {
		return nil, err
	}
	return newWorker(cfg, m, opts, shape).run(ctx)
}

func newWorker(cfg job.Config, m *Model, opts job.Options, shape *shape) *pipeWorker {
	return &pipeWorker{cfg: cfg, log: cfg.Logger, model: m, opts: opts, shape: shape, rep: job.NewReporter(cfg.Reports),
		place: layout.Spare, commits: &commits{}}
}

// run is the worker's life: it joins the job, and trains in the place
// each generation gives it until the job's end.
func (w *pipeWorker) run(ctx context.Context) (*job.Result, error) {
	if err := w.cfg.CheckJoin(); err != nil {
		return nil, err
	}
	defer w.close()
	if err := w.start(ctx); err != nil {
		return nil, err
	}
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); w.watchStop(wctx) }()
	defer func() { stopWatch(); <-watched }() // before the etcd client closes
	err := w.agent.Run(ctx, w.round)
	switch {
	case err != nil:
		return nil, err
	case w.stoppedAt > 0:
		return nil, &job.StoppedError{Step: w.stoppedAt, Requested: true}
	case w.result.Step == 0 && w.stopAsked.Load():
		return nil, &job.StoppedError{Requested: true} // a spare, when the job stopped
	}
	return &w.result, nil
}

// watchStop records the job's stop request: the stages vote on it in
// their next step, and the whole job stops at that step boundary.
func (w *pipeWorker) watchStop(ctx context.Context) {
	reason, err := w.coord.WaitStop(ctx)
	if err != nil {
		return
	}
	w.log.Warn("the job is asked to stop: final checkpoint at the next step boundary", zap.String("reason", reason))
	w.stopAsked.Store(true)
}

// pipeWorker is one worker process's runtime: what outlives a round (its
// place, its stage's layers and optimizer, the sampler's position).
type pipeWorker struct {
	cfg   job.Config
	log   *zap.Logger
	model *Model    // a pipeline model, or
	split SplitFunc // a model split across tensor-parallel ranks
	opts  job.Options
	shape *shape
	rep   *job.Reporter
	undo  []func()

	tr    *collective.TCPTransport
	data  collective.Transport
	agent *elastic.Agent
	store checkpoint.Store // the job's checkpoints (nil: none)

	train, test worker.Dataset
	sampler     *worker.Sampler

	// The place it trained in last (generation gen), and its stage there
	// with its state after step.
	place layout.Place
	gen   uint64
	step  int64
	pos   worker.Position
	stage *stageState
	// last: its last step's report as the last stage of a replica (any:
	// only replica 0's are sent), replayed by the next generation's
	// replica 0 while it holds that step.
	last   Step
	result job.Result
	// commits: this stage's last commits, and copies of the previous
	// stage's (one replica only), kept across generations.
	commits *commits
	// splitLayout: a split model's, how its parameters are cut (the same
	// on every rank; set once, before any index is written).
	splitLayout map[string]logical.Layout

	coord     *coordinator.Job
	stopAsked atomic.Bool    // the job's operator asked it to stop
	stoppedAt int64          // the step the job stopped at, as asked (0: it did not)
	indexing  sync.WaitGroup // indexes being written in the background
}

func (w *pipeWorker) close() {
	for i := len(w.undo) - 1; i >= 0; i-- {
		w.undo[i]()
	}
}

func (w *pipeWorker) start(ctx context.Context) error {
	c := &w.cfg
	var err error
	if w.split == nil { // a split model's data comes with its part (buildTensorStage)
		if w.train, w.test, err = w.model.Data(w.opts, c.Seed); err != nil {
			return fmt.Errorf("pipeline: model %s's data: %w", c.Model, err)
		}
		if w.sampler, err = worker.NewSampler(w.train.Len(), c.Seed); err != nil {
			return err
		}
	}
	dp, err := job.OpenDataPlane(c, w.log)
	if err != nil {
		return err
	}
	tr, hostID := dp.TCP, dp.HostID
	w.tr, w.data = tr, dp.Transport
	w.undo = append(w.undo, func() { tr.Close() })
	cli, err := job.DialEtcd(ctx, c, w.log)
	if err != nil {
		return err
	}
	w.undo = append(w.undo, func() { cli.Close() })
	if c.Checkpoint.Location != "" {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		w.store, err = checkpoint.OpenURL(sctx, c.Checkpoint.Location, c.Credentials)
		cancel()
		if err != nil {
			return fmt.Errorf("phalanx: checkpoint store: %w", err)
		}
	}
	keys, err := coordinator.KeysFor(c.Job)
	if err != nil {
		return job.Invalid("Job", c.Job, "%v", err)
	}
	w.coord = coordinator.NewJob(cli, keys)
	w.agent, err = elastic.New(elastic.Config{Coord: w.coord, Job: c.Job, Transport: w.data,
		HostIdentity: hostID, Collective: collective.Options{Timeout: c.OpTimeout, Logger: w.log, Observer: c.Observer()},
		DataAddr: tr.Addr(), ControlAddr: tr.Addr(), RankHint: c.RankHint, ConfigHash: configHash(c),
		Capabilities: []string{"pipeline", "model:" + c.Model},
		LeaseTTL:     c.LeaseTTL, Unreachable: c.Unreachable, Logger: w.log, Now: c.Now})
	return err
}

// round is one generation: the members state their places, every one
// computes the same layout, and each trains in its new place (or waits,
// a spare, for the next generation).
func (w *pipeWorker) round(ctx context.Context, r *elastic.Round) error {
	lay, members, err := w.layout(ctx, r)
	var few *layout.TooFewError
	switch {
	case errors.As(err, &few):
		w.log.Info("too few workers for a replica; waiting as a spare", zap.Error(err))
		w.place, w.stage = layout.Spare, nil
		<-ctx.Done()
		return context.Cause(ctx)
	case err != nil:
		return err
	}
	var peer *commit
	var moved []int
	if lay.Donor < 0 && lay.Step > 0 {
		w.log.Warn("no replica kept: restoring", zap.Uint64("generation", r.Generation.Number), zap.Any("statements", members))
	}
	if lay.Donor < 0 && lay.Step > 0 {
		// Every copy of a stage was lost (or a lone replica tore): first
		// the commits in the members' memory, restored into replica 0,
		// which then gives the other replicas theirs as a donor; then the
		// checkpoints.
		var found bool
		if peer, moved, found, err = w.fromPeers(ctx, r, lay); err != nil {
			return err
		}
		if found {
			lay.Donor = 0
		}
	}
	me := lay.Places[r.Rank]
	if me == layout.Spare {
		w.log.Info("a spare in this generation", zap.Uint64("generation", r.Generation.Number), zap.Int("replicas", len(lay.Ranks)))
		w.place, w.stage = layout.Spare, nil
		<-ctx.Done()
		return context.Cause(ctx)
	}
	if me == (layout.Place{Replica: 0, Stage: 0}) {
		w.rep.Send(layoutReport(r.Generation.Number, lay, members, w.cfg.Pipeline.Stages))
	}
	from := &restoring{peer: peer, moved: moved}
	if lay.Donor < 0 && peer == nil { // nothing kept: a fresh start, or every copy of a stage lost
		if from, err = w.restoring(ctx, lay); err != nil {
			return err
		}
	}
	rd, err := w.enter(ctx, r, lay, me, from)
	if err != nil {
		w.awaitLoss(ctx, r, err)
		return err
	}
	if me.Replica == 0 && me.Stage == w.cfg.Pipeline.Stages-1 && w.step > 0 && w.last.Step == w.step {
		// The step this replica holds, before any of its steps: the
		// replica 0 that trained it may have been lost before it reported
		// it, or after it reported a later one this replica never
		// finished (the launcher emits the step, or a rollback to it).
		rep := w.last
		rep.Replayed, rep.TrainedIn, rep.Generation, rep.Replicas = true, rep.Generation, r.Generation.Number, len(lay.Ranks)
		w.rep.Send(rep)
	}
	err = w.steps(ctx, rd)
	w.awaitLoss(ctx, r, err)
	rd.close(err != nil && !errors.Is(err, errRoundOver))
	return err
}

// layout gathers every member's statement and plans the generation.
func (w *pipeWorker) layout(ctx context.Context, r *elastic.Round) (layout.Layout, []layout.Member, error) {
	n := r.Group.Size()
	mine := []float64{float64(w.place.Replica), float64(w.place.Stage), float64(w.gen), float64(w.step)}
	if w.stage == nil {
		mine = []float64{-1, -1, 0, float64(w.step)}
	}
	all := make([]float64, 4*n)
	if err := r.Group.AllGather(ctx, collective.Float64s(mine), collective.Float64s(all)); err != nil {
		return layout.Layout{}, nil, err
	}
	members := make([]layout.Member, n)
	for i := range members {
		members[i] = layout.Member{Replica: int(all[4*i]), Stage: int(all[4*i+1]), Gen: uint64(all[4*i+2]), Step: int64(all[4*i+3])}
	}
	lay, err := layout.Plan(members, w.cfg.Pipeline.Stages, w.cfg.Pipeline.Replicas)
	return lay, members, err
}

// layoutReport tells the launcher how generation gen placed the workers:
// the replicas it dropped (and which of their stages were lost), those it
// formed, its spares.
func layoutReport(gen uint64, lay layout.Layout, members []layout.Member, stages int) Layout {
	rep := Layout{Generation: gen, Replicas: len(lay.Ranks), Step: lay.Step, Donor: lay.Donor,
		Dropped: lay.Dropped, Formed: lay.Formed}
	var newest uint64
	for _, m := range members {
		newest = max(newest, m.Gen)
	}
	for _, q := range lay.Dropped {
		for s := range stages {
			held := false
			for _, m := range members {
				held = held || (m.Gen == newest && m.Replica == q && m.Stage == s)
			}
			if !held {
				rep.Lost = append(rep.Lost, [2]int{q, s})
			}
		}
	}
	for _, p := range lay.Places {
		if p == layout.Spare {
			rep.Spares++
		}
	}
	return rep
}

// sched is the job's schedule configuration.
func (w *pipeWorker) sched() schedule.Config {
	p := w.cfg.Pipeline
	return schedule.Config{Kind: schedule.Kind(p.Schedule), Stages: p.Stages, Micro: w.cfg.MicroBatches, Chunks: w.shape.chunks}
}

// restoring is the checkpoint a generation that keeps no replica restores
// every stage from.
type restoring struct {
	src *logical.Source
	// Or a commit from peers' memory, and the stages whose state moved.
	peer  *commit
	moved []int
}

// restoring finds the newest checkpoint to restore when nothing is kept:
// none at a fresh start without one (Checkpoint.Resume makes that an
// error); after the job lost every copy of a stage, the newest (without
// one, the job cannot go on).
func (w *pipeWorker) restoring(ctx context.Context, lay layout.Layout) (*restoring, error) {
	if w.store == nil {
		if lay.Step > 0 {
			return nil, fmt.Errorf("pipeline: every copy of a stage was lost at step %d and the job has no checkpoints (--checkpoint) to restore it from", lay.Step)
		}
		return nil, nil
	}
	src, err := newestSource(ctx, w.store, &w.cfg, func(name string, err error) {
		w.log.Warn("skipping a pipeline checkpoint that does not verify", zap.String("index", name), zap.Error(err))
		w.rep.Send(job.Checkpoint{Checkpoint: checkpoint.Event{Kind: "skipped", ID: name, Err: err.Error()}})
	})
	switch {
	case err != nil:
		return nil, err
	case src == nil && (lay.Step > 0 || w.cfg.Checkpoint.Resume):
		return nil, fmt.Errorf("pipeline: no checkpoint in %s verifies, and the job needs one (step %d lost, or --resume)", w.store.Location(), lay.Step)
	case src == nil:
		return nil, nil
	}
	return &restoring{src: src}, nil
}

// lossWait bounds how long a stage whose link broke waits for the round's
// own group to see the loss.
const lossWait = 2 * time.Second

// awaitLoss, after the round's work failed on one of the stage's own
// groups (a peer lost), waits until the round's group (every member)
// fails by itself too, or the round ends: that group names the lost
// member by its rank in the generation, and the agent reports it to the
// coordinator at once. Returning sooner would abort that group, and the
// peers would see only the abort: nobody would report the loss, and the
// coordinator would learn of it when the dead worker's lease expired.
func (w *pipeWorker) awaitLoss(ctx context.Context, r *elastic.Round, err error) {
	if err == nil || ctx.Err() != nil || !errors.Is(err, collective.ErrPeerLost) && !errors.Is(err, collective.ErrAborted) && !errors.Is(err, collective.ErrTimeout) {
		return
	}
	t := time.NewTimer(lossWait)
	defer t.Stop()
	select {
	case <-r.Group.Failed():
	case <-ctx.Done():
	case <-t.C:
	}
}
