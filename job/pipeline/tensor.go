package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/pipeline/engine"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/tp"
	"github.com/phalanx-rt/phalanx/worker"
)

// Data parallelism × tensor parallelism (--dp D --tp T) runs on this
// kind's machinery: a replica is T worker processes, each holding its
// part of a model that Splits (job.ModelSpec.Split) and running the whole
// of every step on it, its layers' collectives on the replica's group.
// The layout, the gradient reduction across replicas (a group per
// tensor-parallel rank, whose replicas hold the same slices), the step's
// vote, replica drop and re-form, commits copied to a peer and
// checkpoints are the pipeline's: a tensor-parallel rank that dies takes
// its replica with it, as a lost stage does.

// RunTensorWorker runs one worker process of a job of a model split
// across cfg.Pipeline.Tensor ranks a replica.
func RunTensorWorker(ctx context.Context, cfg job.Config, split SplitFunc, opts job.Options) (*job.Result, error) {
	cfg.WorkerDefaults()
	if cfg.Pipeline.Stages == 1 { // started by hand: the launcher sets it
		cfg.Pipeline.Stages = cfg.Pipeline.Tensor
	}
	if err := checkTensor(&cfg); err != nil {
		return nil, err
	}
	w := newWorker(cfg, nil, opts, nil)
	w.split = split
	return w.run(ctx)
}

// SplitFunc builds a tensor-parallel rank's part of a model, and the
// data (job.ModelSpec.Split).
type SplitFunc = func(o job.Options, seed uint64, comm *tp.Comm) (job.Task, error)

// checkTensor checks a job of a split model: T ranks a replica (Stages,
// which Prepare sets to T), one micro-batch, BSP.
func checkTensor(c *job.Config) error {
	if err := c.ValidateCommon(); err != nil {
		return err
	}
	p := &c.Pipeline
	switch {
	case p.Tensor < 1:
		return job.Invalid("Pipeline.Tensor", p.Tensor, "a split model's job needs at least 1 tensor-parallel rank")
	case p.Stages != p.Tensor:
		return job.Invalid("Pipeline.Stages", p.Stages, "pipeline stages (--pp) together with tensor parallelism (--tp %d), a 3-D mesh, are not supported yet", p.Tensor)
	case p.Replicas < 1:
		return job.Invalid("Pipeline.Replicas", p.Replicas, "want at least 1")
	case c.Batch < 1 || c.Batch%p.Replicas != 0:
		return job.Invalid("Batch", c.Batch, "want a positive multiple of the %d replicas (--dp)", p.Replicas)
	case c.MicroBatches != 1:
		return job.Invalid("MicroBatches", c.MicroBatches, "a tensor-parallel replica trains its whole share of a step at once: want 1")
	case c.Sync.Mode != "bsp":
		return job.Invalid("Sync.Mode", c.Sync.Mode, `a tensor-parallel job synchronises every step ("bsp")`)
	}
	return nil
}

// prepareTensor checks a launch of a split model before anything starts:
// T processes a replica, and the model's shape against T (rank 0's part
// is built once, here, so that a T that does not divide it is refused
// with the model's own message).
func prepareTensor(lc *job.LaunchConfig, spec job.ModelSpec, opts job.Options) (*stageState, error) {
	p := &lc.Pipeline
	if p.Stages != 1 {
		return nil, job.Invalid("Pipeline.Stages", p.Stages, "pipeline stages (--pp) together with tensor parallelism (--tp %d), a 3-D mesh, are not supported yet", p.Tensor)
	}
	p.Stages = p.Tensor
	if err := checkTensor(&lc.Config); err != nil {
		return nil, err
	}
	switch want := p.Tensor * p.Replicas; {
	case lc.Workers != want:
		return nil, job.Invalid("Workers", lc.Workers, "a job of %d replicas (--dp) × %d tensor-parallel ranks (--tp) needs %d workers", p.Replicas, p.Tensor, want)
	case lc.MinWorkers < 1 || lc.MaxWorkers < lc.MinWorkers:
		return nil, job.Invalid("MinWorkers", lc.MinWorkers, "want 1 <= MinWorkers <= MaxWorkers (%d)", lc.MaxWorkers)
	case lc.MinWorkersTimeout <= 0:
		return nil, job.Invalid("MinWorkersTimeout", lc.MinWorkersTimeout, "must be positive")
	}
	comm, err := tp.NewCommAt(p.Tensor, 0)
	if err != nil {
		return nil, err
	}
	task, err := spec.Split(opts, lc.Seed, comm)
	if err != nil {
		return nil, job.Invalid("Pipeline.Tensor", p.Tensor, "model %s: %v", spec.Name, err)
	}
	params := task.Model.Params()
	if err := job.CheckMemory(&lc.Config, params, p.Tensor); err != nil { // rank 0's part is the largest
		return nil, err
	}
	sliced, ok := task.Model.(tp.Sliced)
	if !ok {
		return nil, fmt.Errorf("pipeline: model %s's split part (%T) does not say its slices (tp.Sliced)", spec.Name, task.Model)
	}
	st := &stageState{params: params, tensor: &tensorStage{slices: sliced.Slices()}}
	if st.opt, err = nn.NewOptimizer(lc.Optimizer, params); err != nil {
		return nil, err
	}
	return st, nil
}

// tensorStage is what a stage of a split model has beyond stageState's:
// the model, its group, and the parameters whose squares count in the
// replica's gradient norm (every split one, and the whole ones on rank 0
// alone: every rank holds those).
type tensorStage struct {
	model    worker.Model
	eval     worker.Evaluator
	comm     *tp.Comm
	measures func(loss, accuracy float64) map[string]float64
	norm     []*nn.Param
	slices   []tp.Slice
}

// buildTensorStage builds tensor-parallel rank s's part of the model, and
// the job's data the first time.
func (w *pipeWorker) buildTensorStage(s int) (*stageState, error) {
	comm, err := tp.NewCommAt(w.cfg.Pipeline.Tensor, s)
	if err != nil {
		return nil, err
	}
	comm.Now = w.cfg.Now
	task, err := w.split(w.opts, w.cfg.Seed, comm)
	if err != nil {
		return nil, fmt.Errorf("pipeline: building tensor-parallel rank %d of model %s: %w", s, w.cfg.Model, err)
	}
	sliced, ok := task.Model.(tp.Sliced)
	if !ok {
		return nil, fmt.Errorf("pipeline: model %s's split part (%T) does not say its slices (tp.Sliced)", w.cfg.Model, task.Model)
	}
	ts := &tensorStage{model: task.Model, comm: comm, measures: task.Measures, slices: sliced.Slices()}
	ts.eval, _ = task.Model.(worker.Evaluator)
	params := task.Model.Params()
	if len(ts.slices) != len(params) {
		return nil, fmt.Errorf("pipeline: model %s says %d slices of its %d parameters", w.cfg.Model, len(ts.slices), len(params))
	}
	for i, sl := range ts.slices {
		if sl.Local != params[i] {
			return nil, fmt.Errorf("pipeline: model %s's slice %d is of %s, its parameter %d is %s", w.cfg.Model, i, sl.Local.Name, i, params[i].Name)
		}
		if sl.Split() || s == 0 {
			ts.norm = append(ts.norm, sl.Local)
		}
	}
	if w.splitLayout == nil {
		w.splitLayout = splitLayouts(ts.slices)
	}
	if w.train == nil {
		w.train, w.test = task.Train, task.Test
		if w.sampler, err = worker.NewSampler(w.train.Len(), w.cfg.Seed); err != nil {
			return nil, err
		}
	}
	st := &stageState{stage: s, params: params, tensor: ts}
	if st.opt, err = nn.NewOptimizer(w.cfg.Optimizer, st.params); err != nil {
		return nil, err
	}
	return st, nil
}

// tensorEngine runs a split model's steps: the whole step on this rank's
// part, then the reduction across replicas and the update, the same
// functions a pipeline stage's engine calls.
type tensorEngine struct {
	ts     *tensorStage
	data   *stepData
	ready  func(int)
	reduce func(ctx context.Context, s *engine.Stats) error
	update func(ctx context.Context) error
	now    func() time.Time
	broken error
}

// Step runs one training step on the step's data.
func (e *tensorEngine) Step(ctx context.Context) (engine.Stats, error) {
	if e.broken != nil {
		return engine.Stats{}, e.broken
	}
	var st engine.Stats
	t0, spent := e.now(), e.ts.comm.Spent()
	e.ts.comm.Step(ctx)
	res, err := e.ts.model.Step(&e.data.b, e.data.scale, e.ready)
	st.Busy = e.now().Sub(t0)
	st.Wait = e.ts.comm.Spent() - spent // the tensor-parallel collectives' share
	st.Sched = st.Busy
	st.LossSum, st.Correct = res.LossSum, res.Correct
	if err == nil {
		err = e.reduce(ctx, &st)
	}
	if err == nil {
		err = e.update(ctx)
	}
	if err != nil {
		e.broken = fmt.Errorf("tensor-parallel rank %d: %w", e.ts.comm.Rank(), err)
		return st, e.broken
	}
	st.Elapsed = e.now().Sub(t0)
	return st, nil
}

// evaluate scores the model on every held-out sample, 64 at a time: every
// rank of the replica takes part (the layers' collectives), and every
// rank learns the same loss sum and right answers.
func (e *tensorEngine) evaluate(ctx context.Context, test worker.Dataset) (loss float64, correct int, err error) {
	if e.ts.eval == nil {
		return 0, 0, nil
	}
	e.ts.comm.Step(ctx)
	var b worker.Batch
	idx := make([]int, 0, 64)
	for lo := 0; lo < test.Len(); lo += 64 {
		idx = idx[:0]
		for i := lo; i < min(lo+64, test.Len()); i++ {
			idx = append(idx, i)
		}
		if err := test.Fill(idx, &b); err != nil {
			return 0, 0, fmt.Errorf("pipeline: loading held-out samples: %w", err)
		}
		r, err := e.ts.eval.Evaluate(&b)
		if err != nil {
			return 0, 0, err
		}
		loss, correct = loss+r.LossSum, correct+r.Correct
	}
	return loss, correct, e.ts.comm.Err()
}
