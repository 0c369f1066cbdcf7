// Package pipeline is the pipeline-parallel job kind: D replicas of a
// model cut into P consecutive stages, one worker process per stage of a
// replica. A stage runs its micro-batch schedule (package schedule)
// through an engine (package engine) that passes activations and
// gradients to its neighbours as raw tensors over the data plane; each
// stage's gradients are averaged across replicas on a group per stage,
// overlapping the last backward passes. The layout of every generation
// (package layout) keeps replicas whose stages all survived, so that when
// a stage process dies its replica drops out and the others go on at the
// next step. A model split across tensor-parallel ranks (--tp) runs on
// the same machinery, its ranks in place of stages (tensor.go).
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/nn"
)

// Kind is the pipeline kind: a model names it (ModelSpec.Kind
// "pipeline", Impl a *Model).
type Kind struct{}

// Name is "pipeline".
func (Kind) Name() string { return "pipeline" }

// Owns a model whose Impl is a *Model (one that also has a ring form,
// New, only in a job of stages: cfg.Pipeline.Stages above 1), and one
// that Splits in a job of tensor-parallel ranks (cfg.Pipeline.Tensor set).
func (Kind) Owns(spec job.ModelSpec, cfg *job.Config) bool {
	_, ok := spec.Impl.(*Model)
	return ok && (spec.New == nil || cfg.Pipeline.Stages > 1) || (spec.Split != nil && cfg.Pipeline.Tensor > 0)
}

// Worker is the role of a pipeline worker.
func (Kind) Worker() string { return "pipeline-worker" }

// Roles: every process of a pipeline job is a pipeline worker.
func (Kind) Roles() map[string]job.Role {
	return map[string]job.Role{"pipeline-worker": runRole}
}

// Prepare checks a pipeline launch against its model: the replicas and
// stages against the workers started, the micro-batches against a
// replica's batch, the cuts against the model's layers (choosing them
// when none are given).
func (Kind) Prepare(ctx context.Context, lc *job.LaunchConfig, spec job.ModelSpec, opts job.Options) (job.Job, error) {
	m, ok := spec.Impl.(*Model)
	if spec.Split != nil && lc.Pipeline.Tensor > 0 {
		st, err := prepareTensor(lc, spec, opts)
		if err != nil {
			return nil, err
		}
		return prepareStore(ctx, lc, func() (*stageState, error) { return st, nil })
	}
	if !ok {
		return nil, fmt.Errorf("pipeline: model %s is not a pipeline model (ModelSpec.Impl is %T)", spec.Name, spec.Impl)
	}
	p := &lc.Pipeline
	if p.Balance == "time" && len(p.Cuts) == 0 {
		cuts, err := balanceByTime(lc, m, opts)
		if err != nil {
			return nil, err
		}
		p.Cuts = cuts
	}
	if _, err := check(&lc.Config, m, opts); err != nil {
		return nil, err
	}
	if want := p.Stages * p.Replicas; lc.Workers != want {
		return nil, job.Invalid("Workers", lc.Workers, "a pipeline job of %d replicas (--dp) × %d stages (--pp) needs %d workers", p.Replicas, p.Stages, want)
	}
	switch {
	case lc.MinWorkers < 1 || lc.MaxWorkers < lc.MinWorkers:
		return nil, job.Invalid("MinWorkers", lc.MinWorkers, "want 1 <= MinWorkers <= MaxWorkers (%d)", lc.MaxWorkers)
	case lc.MinWorkersTimeout <= 0:
		return nil, job.Invalid("MinWorkersTimeout", lc.MinWorkersTimeout, "must be positive")
	}
	return prepareStore(ctx, lc, func() (*stageState, error) { return wholeModel(&lc.Config, m, opts) })
}

// prepareStore opens the job's checkpoint store, if any, and refuses a
// launch whose workers would refuse the checkpoint they would resume from
// (resumable): state builds the model's state (rank 0's part of a split
// model), only when there is a checkpoint to check.
func prepareStore(ctx context.Context, lc *job.LaunchConfig, state func() (*stageState, error)) (job.Job, error) {
	store, err := job.OpenStore(ctx, &lc.Config, lc.Output)
	if err != nil {
		return nil, err
	}
	if store != nil {
		if err := resumable(ctx, &lc.Config, store, state); err != nil {
			return nil, err
		}
	}
	return prepared{store: store}, nil
}

// wholeModel is every layer of m as one stage.
func wholeModel(c *job.Config, m *Model, opts job.Options) (*stageState, error) {
	ls, err := describe(m, opts)
	if err != nil {
		return nil, err
	}
	layers, err := m.Build(opts, c.Seed, 0, len(ls))
	if err != nil {
		return nil, fmt.Errorf("pipeline: building model %s to check its checkpoint: %w", c.Model, err)
	}
	st := &stageState{}
	for _, l := range layers {
		st.params = append(st.params, l.Params()...)
	}
	if st.opt, err = nn.NewOptimizer(c.Optimizer, st.params); err != nil {
		return nil, err
	}
	return st, nil
}

type prepared struct {
	store checkpoint.Store // the job's checkpoints (nil: none)
}

// Run runs the coordinator and the workers, and turns their reports into
// events and progress lines, until every worker has ended.
func (p prepared) Run(outer, ctx context.Context, cancel context.CancelFunc, env *job.Env) (*job.Result, error) {
	lc := env.LC
	el, err := env.StartElastic(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { cancel(); el.Wait() }()
	threads := launch.ComputeThreads(lc.Threads, lc.Workers, nn.CgoBLAS())
	if err := env.StartWorkers(ctx, "pipeline-worker", threads, events.F("stages", lc.Pipeline.Stages),
		events.F("replicas", lc.Pipeline.Replicas), events.F("schedule", lc.Pipeline.Schedule),
		events.F("micro_batches", lc.MicroBatches), events.F("cuts", lc.Pipeline.Cuts)); err != nil {
		return nil, err
	}
	fmt.Fprintf(env.Out, "pipeline: %d replicas × %d stages, schedule %s, %d micro-batches of %d, cuts at layers %v\n",
		lc.Pipeline.Replicas, lc.Pipeline.Stages, lc.Pipeline.Schedule, lc.MicroBatches,
		lc.Batch/lc.Pipeline.Replicas/lc.MicroBatches, lc.Pipeline.Cuts)
	pj := &pipeJob{Env: env, store: p.store, types: job.NewReportTypes(Step{}, Done{}, StageDone{}, Layout{}, StageRestored{}), line: stepLine{stages: lc.Pipeline.Stages},
		progress: job.Progress{Steps: lc.Steps, Every: every(lc)}}
	var first uint64
	replaced := 0
	stopAsked := outer.Done()
	var grace <-chan time.Time
	for running := lc.Workers; running > 0; {
		select {
		case <-stopAsked:
			stopAsked = nil
			if grace, err = env.AskStop(outer, ctx); err != nil {
				return nil, err
			}
			pj.stopping = true
		case <-grace:
			env.Procs.Signal("", syscall.SIGKILL)
			return nil, fmt.Errorf("asked to stop, the workers did not within %v; killed", lc.Checkpoint.Wait+time.Minute)
		case g := <-el.Generations:
			if first == 0 {
				first = g.Number
			}
			job.GenerationEvents(env.Events, g, first)
		case l := <-env.Procs.Lines():
			if err := pj.handle(l); err != nil {
				env.Procs.Signal("", syscall.SIGKILL)
				return nil, err
			}
		case x := <-env.Procs.Exits():
			running--
			// A worker that dies is the coordinator's to remove: the
			// others close ranks (its replica drops out) and go on, and a
			// replacement process joins them (up to Workers of them in a
			// job): with the spares it re-forms a replica, or takes the
			// lost stage of a lone one.
			env.Events.Emit("worker_exited", events.F("worker", x.Index), events.F("pid", x.Pid), events.F("status", job.ExitText(x.Err)))
			if x.Err != nil && pj.end.done == nil && !pj.stopping && pj.stop == nil {
				fmt.Fprintf(env.Out, "worker %d (pid %d) ended: %s; the others go on\n", x.Index, x.Pid, job.ExitText(x.Err))
				if replaced < lc.Workers && ctx.Err() == nil {
					i := lc.Workers + replaced
					replaced++
					if err := env.Spawn(ctx, job.ProcessSpec{Role: "pipeline-worker", Config: lc.Config, Index: i, RankHint: -1, Threads: threads}); err != nil {
						return nil, err
					}
					running++
					fmt.Fprintf(env.Out, "worker %d started to replace it\n", i)
				}
			}
		case err := <-el.Ended:
			if err != nil && ctx.Err() == nil {
				return nil, fmt.Errorf("coordinator: %w", err)
			}
		}
	}
	for {
		select {
		case l := <-env.Procs.Lines():
			if err := pj.handle(l); err != nil {
				return nil, err
			}
			continue
		default:
		}
		break
	}
	d := pj.end.done
	switch {
	case d == nil && pj.stop != nil:
		return pj.stopped(ctx)
	case d == nil:
		return nil, errors.New("pipeline: every worker ended and none said done")
	}
	pj.end.world = d.Replicas * lc.Pipeline.Stages
	pj.end.event(env.Events)
	same, crc := pj.end.identical()
	return &job.Result{Step: d.Step, Generation: d.Generation, World: d.Replicas * lc.Pipeline.Stages, Loss: d.Loss, Accuracy: d.Accuracy,
		ParametersIdentical: same, ParametersCRC: crc, Metrics: d.Metrics}, nil
}

// every is the steps between progress lines.
func every(lc *job.LaunchConfig) int64 {
	if lc.LogEvery > 0 {
		return lc.LogEvery
	}
	return max(lc.Steps/20, 1)
}

// pipeJob is a running pipeline job as its launcher sees it.
type pipeJob struct {
	*job.Env
	store    checkpoint.Store // the job's checkpoints (nil: none)
	types    job.ReportTypes
	line     stepLine
	progress job.Progress
	end      ending
	lastStep int64 // the newest step a stage reported
	// The last stage's newest step event: its step, and the generation
	// that reported it (a replica 0 of an older one is dropped, or lost
	// and replayed).
	lastEvent int64
	stepGen   uint64
	// restoredGen: the generation whose rollback's restored event was
	// emitted.
	restoredGen uint64
	stopping    bool         // the caller asked the job to stop
	stop        *job.Stopped // where the job stopped, as asked
}

// stopped is the end of a job stopped as asked: its final checkpoint is
// claimed only once its index is seen in the store, verified.
func (pj *pipeJob) stopped(ctx context.Context) (*job.Result, error) {
	step := pj.stop.Step
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	name, err := finalIndex(sctx, pj.store, &pj.LC.Config, step)
	if err != nil {
		fmt.Fprintf(pj.Out, "stopped at step %d WITHOUT a final checkpoint: %v\n", step, err)
		return nil, fmt.Errorf("phalanx: stopped at step %d without a final checkpoint: %w", step, err)
	}
	fmt.Fprintf(pj.Out, "stopped at step %d; final checkpoint %s\n", step, name)
	return nil, &job.StoppedError{Step: step, Requested: true, Checkpoint: name}
}

func (pj *pipeJob) handle(l launch.Line) error {
	rep, err := pj.types.Parse(l)
	if err != nil {
		return err
	}
	switch rep := rep.(type) {
	case Step:
		if rep.World > 0 { // the last stage's: the job's step event
			switch {
			case rep.Generation < pj.stepGen:
				return nil // from a replica 0 that steps no more
			case rep.Replayed && rep.Step < pj.lastEvent:
				// The new replica 0 never finished steps the lost one
				// applied and reported: they are trained again, their
				// first updates lost with it (as a ring's survivors
				// resynced to an older commit).
				pj.Events.Emit("restored", events.F("step", rep.Step), events.F("generation", rep.Generation),
					events.F("world", rep.Replicas*pj.LC.Pipeline.Stages), events.F("steps_redone", pj.lastEvent-rep.Step))
				pj.stepGen, pj.lastEvent = rep.Generation, rep.Step
				return nil
			case rep.Replayed && rep.Step == pj.lastEvent:
				pj.stepGen = rep.Generation
				return nil // reported already
			}
			pj.stepGen, pj.lastEvent = rep.Generation, rep.Step
			rep.stepEvent(pj.Events)
			if rep.Replayed {
				return nil
			}
		}
		pj.lastStep = max(pj.lastStep, rep.Step)
		job.Emit(pj.Events, l.Index, rep)
		if all := pj.line.add(rep); all != nil {
			fmt.Fprint(pj.Out, progressText(&pj.progress, all, pj.LC.Pipeline.Tensor > 0))
		}
	case Done:
		if pj.end.done == nil {
			pj.end.done = &rep
			fmt.Fprint(pj.Out, rep.Text(nil))
		}
	case StageDone:
		pj.end.stages = append(pj.end.stages, rep)
	case Layout:
		rep.events(pj.Events)
		fmt.Fprint(pj.Out, rep.Text(nil))
	case StageRestored:
		// The steps redone are counted from the last the launcher heard
		// of (a worker restored by a job that lost every stage at once
		// knows no later one).
		rep.Lost = max(rep.Lost, pj.lastStep)
		job.Emit(pj.Events, l.Index, rep)
		if rep.Source != "checkpoint" && pj.restoredGen != rep.Generation {
			// The ring's event for a rollback: the steps after Step are
			// trained again.
			pj.restoredGen = rep.Generation
			pj.Events.Emit("restored", events.F("step", rep.Step), events.F("generation", rep.Generation),
				events.F("world", pj.LC.Pipeline.Stages), events.F("steps_redone", rep.Lost-rep.Step))
		}
		fmt.Fprint(pj.Out, rep.Text(nil))
	case job.Checkpoint:
		job.Emit(pj.Events, l.Index, rep)
		fmt.Fprint(pj.Out, rep.Text(nil))
	case job.Stopped:
		if pj.stop == nil {
			pj.stop = &rep
			job.Emit(pj.Events, l.Index, rep)
		}
	case job.Failed:
		job.Emit(pj.Events, l.Index, rep)
		return fmt.Errorf("worker %d failed: %s", l.Index, rep.Reason)
	}
	return nil
}

// balanceByTime measures each layer's forward and backward time on a
// micro-batch and cuts the model so the stages' times are even.
func balanceByTime(lc *job.LaunchConfig, m *Model, opts job.Options) ([]int, error) {
	c := lc.Config
	c.Pipeline.Balance = "params"
	sh, err := check(&c, m, opts)
	if err != nil {
		return nil, err
	}
	cost, err := measure(m, opts, c.Seed, sh.layers, sh.rows*sh.per, 3)
	if err != nil {
		return nil, err
	}
	return cutByCost(sh.layers, cost, c.Pipeline.Stages*c.Pipeline.Chunks)
}
