package pipeline

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/pipeline/engine"
	"github.com/phalanx-rt/phalanx/job/pipeline/layout"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// stageState is a worker's stage: its model chunks (one per virtual
// stage it runs), their parameters in order, and their optimizer. It
// outlives a round when the worker keeps its place.
type stageState struct {
	stage  int
	chunks []engine.Chunk
	params []*nn.Param
	opt    nn.Optimizer
	tensor *tensorStage // a split model's rank (no chunks)
}

// buildStage makes stage s's chunks from the model, weights drawn from
// the job's seed.
func (w *pipeWorker) buildStage(s int) (*stageState, error) {
	if w.split != nil {
		return w.buildTensorStage(s)
	}
	p, v := w.cfg.Pipeline.Stages, w.shape.chunks
	st := &stageState{stage: s}
	for k := range v {
		j := k*p + s
		r := w.shape.ranges[j]
		ls, err := w.model.Build(w.opts, w.cfg.Seed, r[0], r[1])
		if err != nil {
			return nil, fmt.Errorf("pipeline: building layers %d..%d of model %s: %w", r[0], r[1]-1, w.cfg.Model, err)
		}
		if len(ls) != r[1]-r[0] {
			return nil, fmt.Errorf("pipeline: model %s built %d layers for %d..%d", w.cfg.Model, len(ls), r[0], r[1]-1)
		}
		ns, err := nn.NewStage(ls, nn.StageOptions{Recompute: w.cfg.Pipeline.Recompute, First: j == 0})
		if err != nil {
			return nil, err
		}
		st.chunks = append(st.chunks, engine.Chunk{Stage: ns, In: w.shape.layers[r[0]].In, Out: w.shape.layers[r[1]-1].Out})
		st.params = append(st.params, ns.Params()...)
	}
	opt, err := nn.NewOptimizer(w.cfg.Optimizer, st.params)
	if err != nil {
		return nil, err
	}
	st.opt = opt
	return st, nil
}

// tensors are the stage's state in a fixed order: parameters, then the
// optimizer's slots.
func (st *stageState) tensors() [][]float32 {
	var ts [][]float32
	for _, p := range st.params {
		ts = append(ts, p.Value)
	}
	for _, s := range st.opt.Slots() {
		ts = append(ts, s.Data)
	}
	return ts
}

// roundState is what a worker trains with in one generation: the
// engine, the groups under it, and the step's data.
type roundState struct {
	lay       layout.Layout
	me        layout.Place
	links     *engine.Connected
	dp        *collective.Group // the stage's group across replicas (nil: one replica)
	replica   *collective.Group // the replica's stages (nil: one stage)
	fuser     *collective.Fuser[float32]
	eng       *engine.Engine
	tens      *tensorEngine // a split model's, instead of eng
	data      *stepData
	grads     [][]float32 // the fuser's tensors: every parameter's gradient, then the loss and right answers (last stage), then ctl
	offset    []int       // per chunk: its first parameter's index in grads
	stats     []float32   // last stage: [loss sum, correct]
	ctl       []float32   // every stage: [the job's stop asked], summed over the stage's replicas with the gradients
	asked     func() bool // whether the job's operator asked it to stop
	norm      []float64   // the step's vote: the gradients' norm (after clip), stages whose save is stored, stages whose save failed, round over, stop asked
	saver     *saver      // replica 0: the stage's checkpoints (nil: none)
	over      atomic.Bool // the round's context ended: the stage votes to stop after this step
	copier    *copier     // one replica: commits copied to the next stage (nil: none)
	closeOnce bool
}

// close closes the round's groups; after a failure (failed) it aborts
// them first, so that none waits for a peer's goodbye.
func (rd *roundState) close(failed bool) {
	if rd.closeOnce {
		return
	}
	rd.closeOnce = true
	if failed {
		if rd.links != nil {
			rd.links.Abort("the round failed")
		}
		for _, g := range []*collective.Group{rd.dp, rd.replica} {
			if g != nil {
				g.Abort("the round failed")
			}
		}
	}
	if rd.eng != nil {
		rd.eng.Close()
	}
	if rd.copier != nil {
		rd.copier.close()
	}
	if rd.fuser != nil {
		rd.fuser.Close()
	}
	// At once: a healthy group's Close waits for its peer's goodbye, and
	// the peer may be closing another group first.
	var wg sync.WaitGroup
	closing := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	if rd.links != nil {
		closing(rd.links.Close)
	}
	for _, g := range []*collective.Group{rd.dp, rd.replica} {
		if g != nil {
			closing(func() { g.Close() })
		}
	}
	wg.Wait()
}

// enter takes place me of layout lay in round r: it builds or keeps the
// stage, joins its groups, receives the stage's state from the donor
// replica when it is not current, and builds the engine.
func (w *pipeWorker) enter(ctx context.Context, r *elastic.Round, lay layout.Layout, me layout.Place, from *restoring) (_ *roundState, err error) {
	rd := &roundState{lay: lay, me: me}
	defer func() {
		if err != nil { // rd, not the nil returned with err
			rd.close(true)
		}
	}()
	kept := lay.Kept[me.Replica]
	if !kept || w.stage == nil || w.stage.stage != me.Stage {
		if w.stage, err = w.buildStage(me.Stage); err != nil {
			return nil, err
		}
	}
	if from != nil && from.peer != nil {
		pos, err := from.peer.load(w.stage)
		if err != nil {
			return nil, err
		}
		w.step, w.pos = from.peer.step, pos
		w.commits = &commits{} // of a timeline rolled back
		source := "commit"     // its own, in memory
		if slices.Contains(from.moved, me.Stage) {
			source = "peer"
		}
		w.rep.Send(StageRestored{Stage: me.Stage, Source: source, Step: w.step, Lost: lay.Step, Generation: r.Generation.Number})
		w.log.Info("stage restored from a commit in memory", zap.Int64("step", w.step), zap.Bool("moved", slices.Contains(from.moved, me.Stage)))
	} else if from != nil && from.src != nil {
		w.commits = &commits{}
		src := from.src
		if err := restoreStage(ctx, src, w.stage); err != nil {
			return nil, err
		}
		x := src.Index
		w.step, w.pos = x.Step, worker.Position{Epoch: x.Epoch, Offset: x.Offset}
		if me.Replica == 0 { // resumed, or a stage lost with every copy: the pipeline rolls back
			w.rep.Send(StageRestored{Stage: me.Stage, Source: "checkpoint", Step: x.Step, Lost: lay.Step, Generation: r.Generation.Number})
		}
		if me == (layout.Place{}) {
			before := x.Stages
			if src.Kind == "ring" {
				before = int(src.Manifest(0).World)
			}
			w.rep.Send(job.Checkpoint{Step: x.Step, Checkpoint: checkpoint.Event{Kind: "restored", ID: src.ID,
				Step: x.Step, URL: w.store.Location(), WorldBefore: before, WorldAfter: w.cfg.Pipeline.Stages}})
		}
		w.log.Info("stage restored from a checkpoint", zap.Int64("step", w.step), zap.Int("stages_before", from.src.Index.Stages), zap.String("format", from.src.Kind))
	}
	for _, p := range w.stage.params { // a failed step's partial sums
		clear(p.Grad)
	}
	g := r.Generation
	addr := func(rank int) string { return g.Members[rank].DataAddr }
	p, d := w.cfg.Pipeline.Stages, len(lay.Ranks)
	opts := collective.Options{Timeout: w.cfg.OpTimeout, Logger: w.log, Observer: w.cfg.Observer()}
	stageAddrs := make([]string, p)
	for s := range p {
		stageAddrs[s] = addr(lay.Ranks[me.Replica][s])
	}
	if w.split == nil {
		if rd.links, err = engine.Connect(ctx, w.data, engine.LinkSpec{Job: fmt.Sprintf("%s/pp/r%d", w.cfg.Job, me.Replica),
			Generation: g.Number, Schedule: w.sched(), Stage: me.Stage, Addrs: stageAddrs, Options: opts}); err != nil {
			return nil, err
		}
	}
	if d > 1 {
		peers := make([]string, d)
		for q := range d {
			peers[q] = addr(lay.Ranks[q][me.Stage])
		}
		m := collective.Membership{Job: fmt.Sprintf("%s/dp/s%d", w.cfg.Job, me.Stage), Generation: g.Number, Rank: me.Replica, Peers: peers}
		if rd.dp, err = collective.Join(ctx, w.data, m, opts); err != nil {
			return nil, fmt.Errorf("pipeline: stage %d's group across replicas: %w", me.Stage, err)
		}
	}
	if p > 1 {
		m := collective.Membership{Job: fmt.Sprintf("%s/rep/r%d", w.cfg.Job, me.Replica), Generation: g.Number, Rank: me.Stage, Peers: stageAddrs}
		if rd.replica, err = collective.Join(ctx, w.data, m, opts); err != nil {
			return nil, fmt.Errorf("pipeline: replica %d's group: %w", me.Replica, err)
		}
		if ts := w.stage.tensor; ts != nil {
			if err := ts.comm.Use(ctx, rd.replica); err != nil {
				return nil, err
			}
		}
	}
	if err := w.synchronise(ctx, rd, kept); err != nil {
		return nil, err
	}
	if d == 1 && p > 1 && w.cfg.CommitEvery > 0 {
		if rd.copier, err = w.startCopier(ctx, r, lay, me); err != nil {
			return nil, err
		}
	}
	w.place, w.gen = me, g.Number
	return rd, w.buildEngine(rd)
}

// synchronise brings the stage's state to the donor replica's: a replica
// that is not kept receives its stage's parameters, optimizer slots, step
// and sampler position from the donor over the stage's group.
func (w *pipeWorker) synchronise(ctx context.Context, rd *roundState, kept bool) error {
	lay := rd.lay
	if rd.dp == nil || lay.Donor < 0 {
		return nil
	}
	allKept := !slices.Contains(lay.Kept, false)
	if allKept {
		return nil
	}
	head := []float64{float64(w.step), float64(w.pos.Epoch), float64(w.pos.Offset)}
	if err := rd.dp.Broadcast(ctx, collective.Float64s(head), lay.Donor); err != nil {
		return fmt.Errorf("pipeline: receiving stage %d's step from replica %d: %w", rd.me.Stage, lay.Donor, err)
	}
	for _, t := range w.stage.tensors() {
		if err := rd.dp.Broadcast(ctx, collective.Float32s(t), lay.Donor); err != nil {
			return fmt.Errorf("pipeline: receiving stage %d's state from replica %d: %w", rd.me.Stage, lay.Donor, err)
		}
	}
	if !kept {
		w.step, w.pos = int64(head[0]), worker.Position{Epoch: int64(head[1]), Offset: int64(head[2])}
		w.log.Info("stage state received from the donor replica", zap.Int("donor", lay.Donor), zap.Int64("step", w.step))
	}
	return nil
}

// buildEngine builds the round's engine over the stage's links and its
// gradient reduction across replicas.
func (w *pipeWorker) buildEngine(rd *roundState) error {
	st := w.stage
	features, per := 0, 1 // a split model's samples are its own (Batch.IDs)
	if w.shape != nil {
		features, per = w.shape.layers[0].In, w.shape.per
	}
	rd.data = &stepData{rows: make([]int, w.cfg.MicroBatches), offs: make([]int, w.cfg.MicroBatches), features: features, per: per}
	if st.tensor != nil {
		rd.offset = []int{0}
		for _, p := range st.params {
			rd.grads = append(rd.grads, p.Grad)
		}
	}
	for k := range st.chunks {
		rd.offset = append(rd.offset, len(rd.grads))
		for _, p := range st.chunks[k].Stage.Params() {
			rd.grads = append(rd.grads, p.Grad)
		}
	}
	reduce, update, err := w.reduction(rd)
	if err != nil {
		return err
	}
	var ready func(k, p int)
	if rd.fuser != nil {
		ready = func(k, p int) { rd.fuser.MarkReady(rd.offset[k] + p) }
	}
	if st.tensor != nil {
		e := &tensorEngine{ts: st.tensor, data: rd.data, reduce: reduce, update: update, now: w.now}
		if ready != nil {
			e.ready = func(p int) { ready(0, p) }
		}
		rd.tens = e
		return nil
	}
	// A replica's share of the global batch grows when replicas drop out.
	m, replicas := w.cfg.MicroBatches, len(rd.lay.Ranks)
	rows := ((w.cfg.Batch+replicas-1)/replicas + m - 1) / m * per
	cfg := engine.Config{Schedule: w.sched(), Stage: rd.me.Stage, Chunks: st.chunks, Rows: rows,
		Links: rd.links.Links, Data: rd.data, Now: w.cfg.Now, Ready: ready, Reduce: reduce, Update: update, Trace: w.cfg.Tracer}
	rd.eng, err = engine.New(cfg)
	return err
}

func (w *pipeWorker) now() time.Time {
	if w.cfg.Now != nil {
		return w.cfg.Now()
	}
	return time.Now()
}

// reduction prepares the step's end, the same for a pipeline stage and a
// split model's rank: the reduction of the gradients (rd.grads, filled by
// the caller) with the step's statistics across replicas (reduce), then
// the replica's vote, the clipping and the optimizer's update (update).
func (w *pipeWorker) reduction(rd *roundState) (reduce func(ctx context.Context, s *engine.Stats) error, update func(ctx context.Context) error, err error) {
	st := w.stage
	lastStage := rd.me.Stage == w.cfg.Pipeline.Stages-1
	statsAt := len(rd.grads)
	if lastStage { // the loss, the right answers and the fingerprint of the samples
		rd.stats = make([]float32, 7)
		rd.grads = append(rd.grads, rd.stats)
	}
	ctlAt := len(rd.grads)
	rd.ctl = make([]float32, 1)
	rd.grads = append(rd.grads, rd.ctl)
	rd.asked = w.stopAsked.Load
	if rd.dp != nil {
		rd.fuser = collective.NewFuser(context.Background(), rd.dp, rd.grads, collective.Sum, w.cfg.BucketBytes)
	}
	rd.norm = make([]float64, 5) // the norm², the checkpoint vote (stored, failed), stages whose round is over, stop asked
	if rd.me.Replica == 0 && w.store != nil {
		if rd.saver, err = newSaver(w.store, &w.cfg, w.cfg.Pipeline.Stages, rd.me.Stage, st, w.log); err != nil {
			return nil, nil, err
		}
	}
	reduce = func(ctx context.Context, s *engine.Stats) error {
		if rd.fuser == nil {
			return nil
		}
		if lastStage { // the replicas' loss, right answers and samples, reduced with the gradients
			rd.stats[0], rd.stats[1] = float32(s.LossSum), float32(s.Correct)
			fp := worker.FingerprintOf(rd.data.idx)
			for i, v := range fp {
				rd.stats[2+i] = float32(v)
			}
			rd.fuser.MarkReady(statsAt)
		}
		// Whether the operator asked the job to stop, as this stage saw
		// it: summed over the replicas here, and over the stages in the
		// step's vote, every worker of the job learns the same.
		rd.ctl[0] = 0
		if rd.asked() {
			rd.ctl[0] = 1
		}
		rd.fuser.MarkReady(ctlAt)
		return rd.fuser.Wait(ctx)
	}
	sched := w.cfg.LRSchedule()
	counted := st.params
	if st.tensor != nil {
		counted = st.tensor.norm // a whole parameter once, not once a rank
	}
	update = func(ctx context.Context) error {
		// The replica's stages agree, in one small allreduce, that every
		// one of them has its reduced gradients (and on their global
		// norm): a step is applied by all of a replica's stages or, when
		// one fails first, by none, so a replica never tears.
		if err := clip(ctx, rd, counted, st.params, w.cfg.ClipNorm); err != nil {
			return err
		}
		st.opt.Update(st.params, sched.LR(w.step+1), w.step+1)
		for _, p := range st.params {
			clear(p.Grad)
		}
		if rd.fuser != nil {
			rd.fuser.Reset()
		}
		return nil
	}
	return reduce, update, nil
}

// clip scales the stage's gradients (params) so that the global norm
// over every stage of the replica is at most max (0: no clipping); the
// stage's part of the norm is over counted. The norm is left in
// rd.norm[0].
func clip(ctx context.Context, rd *roundState, counted, params []*nn.Param, max float64) error {
	var sq float64
	for _, p := range counted {
		for _, g := range p.Grad {
			sq += float64(g) * float64(g)
		}
	}
	rd.norm[0], rd.norm[1], rd.norm[2], rd.norm[3], rd.norm[4] = sq, 1, 0, 0, 0
	if rd.over.Load() {
		rd.norm[3] = 1
	}
	switch {
	case rd.fuser != nil:
		rd.norm[4] = float64(rd.ctl[0]) // the stage's replicas' (this one's included)
	case rd.asked():
		rd.norm[4] = 1
	}
	if rd.saver != nil {
		rd.norm[1], rd.norm[2] = rd.saver.vote()
	}
	if rd.replica != nil {
		if err := rd.replica.AllReduce(ctx, collective.Float64s(rd.norm), collective.Sum); err != nil {
			return fmt.Errorf("pipeline: the replica's gradient norm: %w", err)
		}
	}
	norm := math.Sqrt(rd.norm[0])
	rd.norm[0] = norm
	if max > 0 && norm > max {
		nn.ScaleGrads(params, float32(max/norm))
	}
	return nil
}
