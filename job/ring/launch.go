package ring

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/logical"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Kind is the data-parallel ring job: elastic workers (a ring model's
// New) under a coordinator, each training the whole model on its share of
// every step's batch and averaging gradients over the ring.
type Kind struct{}

// Name is "ring".
func (Kind) Name() string { return "ring" }

// Owns a model with New.
func (Kind) Owns(spec job.ModelSpec, cfg *job.Config) bool {
	return spec.New != nil && cfg.Pipeline.Tensor == 0 && cfg.Pipeline.Stages <= 1
}

// Worker is the role of a ring worker.
func (Kind) Worker() string { return "worker" }

// Roles: every process of a ring job is a worker.
func (Kind) Roles() map[string]job.Role {
	return map[string]job.Role{"worker": runModel}
}

// runModel runs a ring worker of a registered model.
func runModel(ctx context.Context, cfg job.Config, reg *job.Registry) (*job.Result, error) {
	spec, opts, err := reg.Check(&cfg)
	if err != nil {
		return nil, err
	}
	task, err := spec.New(opts, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("phalanx: building model %s: %w", spec.Name, err)
	}
	return RunWorker(ctx, cfg, task)
}

// Prepare checks a ring launch, opens its checkpoint store and refuses
// one whose workers would refuse to resume.
func (Kind) Prepare(ctx context.Context, lc *job.LaunchConfig, spec job.ModelSpec, opts job.Options) (job.Job, error) {
	if err := lc.Config.Validate(); err != nil {
		return nil, err
	}
	switch {
	case lc.MinWorkers < 1 || lc.MaxWorkers < lc.MinWorkers:
		return nil, job.Invalid("MinWorkers", lc.MinWorkers, "want 1 <= MinWorkers <= MaxWorkers (%d)", lc.MaxWorkers)
	case lc.MinWorkersTimeout <= 0:
		return nil, job.Invalid("MinWorkersTimeout", lc.MinWorkersTimeout, "must be positive")
	case lc.JoinWindow < 0:
		return nil, job.Invalid("JoinWindow", lc.JoinWindow, "must not be negative")
	case lc.Faults.FailWorker >= lc.Workers:
		return nil, job.Invalid("Faults.FailWorker", lc.Faults.FailWorker, "not below Workers %d", lc.Workers)
	}
	if lc.Rescale == "lr" && lc.ReferenceWorld == 0 {
		lc.ReferenceWorld = lc.Workers
	}
	if lc.MaxMemory > 0 {
		task, err := spec.New(opts, lc.Seed)
		if err != nil {
			return nil, fmt.Errorf("phalanx: building model %s: %w", spec.Name, err)
		}
		if err := job.CheckMemory(&lc.Config, task.Model.Params(), 1); err != nil {
			return nil, err
		}
	}
	store, err := job.OpenStore(ctx, &lc.Config, lc.Output)
	if err != nil {
		return nil, err
	}
	if err := resumable(ctx, &lc.Config, store, spec, opts); err != nil {
		return nil, fmt.Errorf("phalanx: %w", err)
	}
	return prepared{store}, nil
}

// prepared is a checked ring launch and its store.
type prepared struct{ store checkpoint.Store }

func (p prepared) Run(outer, ctx context.Context, cancel context.CancelFunc, env *job.Env) (*job.Result, error) {
	return newRingJob(env, p.store).run(outer, ctx, cancel)
}

// ringJob is a running ring job as its launcher sees it.
type ringJob struct {
	*job.Env
	store checkpoint.Store // the job's checkpoints (nil: none)
	now   func() time.Time
	start time.Time
	every int64 // steps between progress lines
	// This run's steps: from is the step it started after (a resumed
	// job's restored step), fromAt when its first step was reported;
	// winSamples and winSecs are what was trained since the last progress
	// line, whose samples/s is their ratio.
	from                int64
	fromAt              time.Time
	winSamples, winSecs float64
	first               uint64 // the first generation's number
	byPid               map[int64]int
	done                *Done
	stopped             string // the coordinator's reason
	stop                *job.Stopped
	stepGen             uint64 // the generation of the latest step report
	lastStep            int64
	said                map[string]bool // checkpoints whose skip the terminal was told of
	// failed is the job's failure: the first worker's own, said in its
	// last report or by its exit. killAt, when a failure that every rank
	// meets (a non-finite step) lets the others end on their own, is when
	// they are killed if they have not.
	failed error
	killAt <-chan time.Time
	cancel context.CancelFunc // ends the job's own context
	// seen is the newest generation read from etcd; pending the rings'
	// resumptions reported for a newer one, whose lines are told once it
	// is read (their events are emitted at once, before the ring's steps').
	seen    uint64
	pending []resumption
	types   job.ReportTypes // what its workers report
}

// newRingJob is the launcher's side of a ring job in environment j, its
// clock the launch's.
func newRingJob(j *job.Env, store checkpoint.Store) *ringJob {
	now := j.LC.Now
	if now == nil {
		now = time.Now
	}
	return &ringJob{Env: j, store: store, now: now, start: now(), every: cmp.Or(j.LC.LogEvery, max(1, j.LC.Steps/20)), byPid: map[int64]int{},
		types: reportTypes()}
}

// run runs the job to its end: its coordinator, the following of its
// generations and its workers, then the event loop, then the end's
// decision.
func (r *ringJob) run(outer, ctx context.Context, cancel context.CancelFunc) (*job.Result, error) {
	r.cancel = cancel
	if err := r.clearEnd(ctx); err != nil {
		return nil, err
	}
	el, err := r.StartElastic(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { // stop following and deciding before the client and etcd close
		cancel()
		el.Wait()
	}()
	if err := r.startWorkers(ctx); err != nil {
		return nil, err
	}
	if err := r.loop(outer, ctx, el); err != nil {
		return nil, err
	}
	return r.end(ctx)
}

// clearEnd clears the last run's end from etcd, through its transient
// errors.
func (r *ringJob) clearEnd(ctx context.Context) error {
	return coordinator.Retry(ctx, job.EtcdRetryBudget, func(err error) {
		r.Log.Warn("clearing the last run's end: etcd unavailable; retrying", zap.Error(err))
	}, func(ctx context.Context) error { return r.Coord.ClearEnd(ctx) })
}

// startWorkers starts the job's worker processes and says so: the
// job_started event, the terminal's first lines.
func (r *ringJob) startWorkers(ctx context.Context) error {
	lc := r.LC
	if err := r.StartWorkers(ctx, "worker", launch.ComputeThreads(lc.Threads, lc.Workers, nn.CgoBLAS())); err != nil {
		return err
	}
	fmt.Fprintf(r.Out, "phalanx: %s on %d workers (min %d, max %d), %d steps, global batch %d; job %s, etcd %s\n",
		lc.Model, lc.Workers, lc.MinWorkers, lc.MaxWorkers, lc.Steps, lc.Batch, lc.Job, job.JoinEndpoints(r.Endpoints))
	fmt.Fprintf(r.Out, "data plane %s, gradients as %s; matrix products on %s\n", lc.Transport, lc.WireDType, nn.BLAS())
	return nil
}

// loop is the job's event loop, until every worker has exited: a stop
// asked by the caller (outer), the workers' report lines and exits, the
// generations read from etcd and the coordinator's end (el), the job's own
// end.
func (r *ringJob) loop(outer, ctx context.Context, el *job.Elastic) error {
	running := r.LC.Workers
	coordDone := el.Ended
	stopAsked := outer.Done()
	var grace <-chan time.Time
	for running > 0 {
		select {
		case <-stopAsked:
			stopAsked = nil
			var err error
			if grace, err = r.AskStop(outer, ctx); err != nil {
				return err
			}
		case <-grace:
			return fmt.Errorf("asked to stop, the workers did not within %v; killed", r.LC.Checkpoint.Wait+time.Minute)
		case l := <-r.Procs.Lines():
			if err := r.handle(l); err != nil {
				return err
			}
		case <-r.killAt:
			r.killAt = nil
			r.endFailed()
		case g := <-el.Generations:
			r.generation(g)
		case x := <-r.Procs.Exits():
			running--
			if err := r.exit(x); err != nil {
				return err
			}
		case err := <-coordDone:
			coordDone = nil
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("coordinator: %w", err)
			}
		case <-ctx.Done():
			if r.failed != nil {
				continue
			}
			return ctx.Err()
		}
	}
	return nil
}

// exit judges a worker's exit once its last lines are read.
func (r *ringJob) exit(x launch.Exit) error {
	// A child's lines all come before its exit: its last word (a
	// failure's reason) is read before its exit is judged.
	if err := r.drainLines(); err != nil {
		return err
	}
	r.exited(x)
	if r.failed == nil && r.done == nil && x.Err != nil && !launch.Signalled(x.Err) && launch.ExitStatus(x.Err) != job.ExitStopped {
		// One worker's own failure (not a kill) ends the job.
		r.failed = fmt.Errorf("worker %d (pid %d) failed: %s", x.Index, x.Pid, x.Err)
		r.endFailed()
	}
	return nil
}

// end decides, once every worker has exited, how the job ended: failed,
// stopped (with its final checkpoint, or not), done, or none of those.
func (r *ringJob) end(ctx context.Context) (*job.Result, error) {
	if err := r.drainLines(); err != nil {
		return nil, err
	}
	r.resumed(math.MaxUint64)
	switch {
	case r.failed != nil:
		return nil, r.failed
	case r.done == nil && r.stop != nil:
		// Claimed only once the checkpoint is seen complete in the store.
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		id, err := finalCheckpoint(sctx, r.store, r.stop.Step)
		scancel()
		if err != nil {
			fmt.Fprintf(r.Out, "stopped at step %d WITHOUT a final checkpoint: %v\n", r.stop.Step, err)
			return nil, fmt.Errorf("phalanx: stopped at step %d without a final checkpoint: %w", r.stop.Step, err)
		}
		return nil, &job.StoppedError{Step: r.stop.Step, Requested: true, Checkpoint: id}
	case r.done == nil && r.stopped != "":
		return nil, &job.StoppedError{Reason: r.stopped}
	case r.done == nil:
		return nil, errors.New("phalanx: every worker ended and none reported the job done")
	}
	d := r.done
	fmt.Fprintln(r.Out, r.doneLine(d))
	return &job.Result{Step: d.Step, Generation: d.Generation, World: d.World, Loss: d.Loss, Accuracy: d.Accuracy,
		ParametersIdentical: d.Identical, ParametersCRC: d.ParamsCRC, RankCRCs: d.RankCRCs, Metrics: d.Metrics}, nil
}

// doneLine says how the job ended: the steps this run trained (and, for a
// resumed job, which), in how long, and the held-out figures.
func (r *ringJob) doneLine(d *Done) string {
	took := r.now().Sub(r.start).Round(time.Millisecond)
	steps := fmt.Sprintf("%d steps", d.Step)
	if r.from > 0 {
		steps = fmt.Sprintf("%d steps (%d to %d)", d.Step-r.from, r.from+1, d.Step)
	}
	var more string
	for _, k := range slices.Sorted(maps.Keys(d.Metrics)) {
		more += fmt.Sprintf(", %s %.4f", k, d.Metrics[k])
	}
	return fmt.Sprintf("done: %s in %s; held-out loss %.4f, accuracy %.2f%%%s", steps, took, d.Loss, 100*d.Accuracy, more)
}

// progress prints a progress line every r.every steps and at the last: the
// samples/s trained since the previous line, and an ETA from this run's own
// pace (a resumed job's earlier steps took no time of this run's).
func (r *ringJob) progress(rep Step) {
	now := r.now()
	if r.fromAt.IsZero() {
		r.from, r.fromAt = rep.Step-1, now
	}
	if !rep.Replayed {
		r.winSamples += rep.SamplesPS * rep.StepS // the step's samples
		r.winSecs += rep.StepS
	}
	steps := r.LC.Steps
	if rep.Step%r.every != 0 && rep.Step != steps {
		return
	}
	rate := "       -"
	if r.winSecs > 0 {
		rate = fmt.Sprintf("%8.0f", r.winSamples/r.winSecs)
	}
	r.winSamples, r.winSecs = 0, 0
	eta := "-"
	if n := rep.Step - r.from - 1; n > 0 { // steps since the first one's report
		eta = (now.Sub(r.fromAt) / time.Duration(n) * time.Duration(steps-rep.Step)).Round(time.Second).String()
	}
	fmt.Fprintf(r.Out, "step %*d/%d  loss %.4f  acc %5.1f%%  %s samples/s  %d workers  ETA %s\n",
		len(strconv.FormatInt(steps, 10)), rep.Step, steps, rep.Loss, 100*rep.Accuracy, rate, rep.World, eta)
}

// resumable refuses, before anything starts, a launch whose workers would
// refuse to resume: --resume with no complete checkpoint in the store, or a
// newest checkpoint written by another model or optimizer layout (the same
// IncompatibleError a worker's restore would give, found after etcd, the
// workers and a generation were spent). It builds the model once to learn
// its layout. A newest checkpoint whose manifest does not read is left to
// the workers, which skip it for an older one and say so.
func resumable(ctx context.Context, c *job.Config, store checkpoint.Store, spec job.ModelSpec, opts job.Options) error {
	if store == nil {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	infos, err := checkpoint.List(lctx, store)
	if err != nil {
		return fmt.Errorf("checkpoint: listing %s: %w", store.Location(), err)
	}
	i := slices.IndexFunc(infos, func(in checkpoint.Info) bool { return in.Complete })
	indexed, err := logical.NewestIndex(lctx, store, logical.StateHash(c.Model, c.ModelOptions, c.Optimizer.Kind, c.Seed), func(string, error) {})
	if err != nil {
		return err
	}
	if indexed != nil && (i < 0 || indexed.Index.Step > infos[i].Step) { // the ring resumes from the parts (restoreIndexed)
		params, slots, err := modelState(spec, opts, c, indexed.ID)
		if err != nil {
			return err
		}
		tensors := stateTensors(params, slots)
		return indexed.Check(tensors, logical.Shapes(tensors))
	}
	if i < 0 {
		if c.Checkpoint.Resume {
			return fmt.Errorf("checkpoint: %s: %w", store.Location(), checkpoint.ErrNoCheckpoint)
		}
		return nil
	}
	m, err := checkpoint.ReadManifest(lctx, store, infos[i].ID)
	if err != nil {
		return nil
	}
	params, slots, err := modelState(spec, opts, c, m.Id)
	if err != nil {
		return err
	}
	if err := checkpoint.Compatible(m, stateTensors(params, slots)); err != nil {
		return &checkpoint.IncompatibleError{ID: m.Id, Reason: err.Error()}
	}
	if _, state := checkpointHashes(c, params, slots); m.StateHash != state {
		return &checkpoint.IncompatibleError{ID: m.Id, Reason: fmt.Sprintf("it was written with model, optimizer or data flags of hash %s; this job's are %s", m.StateHash, state)}
	}
	return nil
}

// modelState builds the model once to learn its state's layout: its
// parameters and its optimizer's slots (to check checkpoint id against).
func modelState(spec job.ModelSpec, opts job.Options, c *job.Config, id string) ([]*nn.Param, []nn.Tensor, error) {
	task, err := spec.New(opts, c.Seed)
	if err != nil {
		return nil, nil, fmt.Errorf("building the model to check checkpoint %s against: %w", id, err)
	}
	params := task.Model.Params()
	opt, err := nn.NewOptimizer(c.Optimizer, params)
	if err != nil {
		return nil, nil, err
	}
	return params, opt.Slots(), nil
}

// checkpoint logs a worker's checkpoint report and says it on the
// terminal (a damaged checkpoint once, however many ranks found it so).
func (r *ringJob) checkpoint(worker int, rep job.Checkpoint) {
	job.Emit(r.Events, worker, rep)
	if e := rep.Checkpoint; e.Kind == "skipped" {
		if r.said[e.ID] {
			return
		}
		if r.said == nil {
			r.said = map[string]bool{}
		}
		r.said[e.ID] = true
	}
	fmt.Fprint(r.Out, job.CheckpointText(&rep.Checkpoint))
}

func (r *ringJob) exited(x launch.Exit) {
	r.Events.Emit("worker_exited", events.F("worker", x.Index), events.F("pid", x.Pid), events.F("status", job.ExitText(x.Err)))
	stopping := r.stop != nil || r.stopped != ""
	if x.Err != nil && r.done == nil && !(stopping && launch.ExitStatus(x.Err) == job.ExitStopped) { // a stopped job's workers exit so
		fmt.Fprintf(r.Out, "worker %d (pid %d) ended: %s\n", x.Index, x.Pid, job.ExitText(x.Err))
	}
}

// generation reports a new generation: who is in the ring, who was lost,
// who left and who joined.
func (r *ringJob) generation(g *phalanxpb.Generation) {
	if r.first == 0 {
		r.first = g.Number
	}
	defer r.resumed(g.Number)
	job.GenerationEvents(r.Events, g, r.first)
	if g.Stopped {
		r.stopped = g.Reason
		fmt.Fprintf(r.Out, "generation %d: job stopped: %s\n", g.Number, g.Reason)
		return
	}
	fmt.Fprintf(r.Out, "generation %d: %d workers (%s)\n", g.Number, len(g.Members), g.Reason)
}

// resumption is a ring's resumption (a Restored report of its rank 0) as
// the launcher tells it: its event, emitted at once when the first
// generation was read already, and its line, after its generation's.
type resumption struct {
	Restored
	emitted bool // its restored event
}

// resumed tells of the rings resumed in generations up to seen (the
// newest read from etcd; every one, at the job's end), in order.
func (r *ringJob) resumed(seen uint64) {
	r.seen = max(r.seen, seen)
	n := 0
	for _, res := range r.pending {
		if res.Generation > r.seen {
			r.pending[n] = res
			n++
			continue
		}
		if r.first != 0 && res.Generation > r.first {
			if !res.emitted {
				r.restoredEvent(res.Restored)
			}
			fmt.Fprintf(r.Out, "generation %d: resumed at step %d on %d workers, %d steps redone\n", res.Generation, res.Step, res.World, res.Redone)
		}
	}
	r.pending = r.pending[:n]
}

// restoredEvent is a ring's resumption in the event log.
func (r *ringJob) restoredEvent(rep Restored) {
	r.Events.Emit("restored", events.F("generation", rep.Generation), events.F("world", rep.World), events.F("step", rep.Step),
		events.F("steps_redone", rep.Redone), events.F("root", rep.Root))
}

// finalCheckpoint returns the name of the complete checkpoint of step in
// store, once its manifest reads and matches its own checksum; otherwise an
// error that says which checkpoint a resume would take instead.
func finalCheckpoint(ctx context.Context, store checkpoint.Store, step int64) (string, error) {
	if store == nil {
		return "", errors.New("the job has no checkpoint store")
	}
	infos, err := checkpoint.List(ctx, store)
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", store.Location(), err)
	}
	var bad []string
	for _, in := range infos { // newest first
		if !in.Complete {
			continue
		}
		_, err := checkpoint.ReadManifest(ctx, store, in.ID)
		switch {
		case err == nil && in.Step == step:
			return in.ID, nil
		case err == nil:
			return "", fmt.Errorf("no complete checkpoint of step %d in %s; the newest is of step %d (%s): launched again, the job resumes there and trains steps %d..%d again%s",
				step, store.Location(), in.Step, in.ID, in.Step+1, step, joinBad(bad))
		}
		bad = append(bad, err.Error())
	}
	return "", fmt.Errorf("no complete checkpoint in %s: launched again, the job starts afresh%s", store.Location(), joinBad(bad))
}

func joinBad(bad []string) string {
	if len(bad) == 0 {
		return ""
	}
	return " (refused: " + strings.Join(bad, "; ") + ")"
}

// handle takes one report line of a worker.
func (r *ringJob) handle(l launch.Line) error {
	rep, err := r.types.Parse(l)
	if err != nil {
		return err
	}
	switch rep := rep.(type) {
	case job.Registered:
		r.byPid[int64(rep.Pid)] = l.Index
	case Restored:
		job.Emit(r.Events, l.Index, rep)
		res := resumption{Restored: rep}
		if r.first != 0 && rep.Generation > r.first {
			r.restoredEvent(rep)
			res.emitted = true
		}
		// Told after its generation's line: a worker's report may come
		// before the launcher has read the generation from etcd.
		r.pending = append(r.pending, res)
		r.resumed(r.seen)
	case Step:
		if rep.Generation < r.stepGen || (rep.Replayed && rep.Step <= r.lastStep) {
			return nil // from a rank 0 of a ring that steps no more, or already reported
		}
		r.stepGen, r.lastStep = rep.Generation, rep.Step
		job.Emit(r.Events, l.Index, rep)
		r.progress(rep)
	case Restart:
		job.Emit(r.Events, l.Index, rep)
		fmt.Fprint(r.Out, rep.Text(nil))
	case job.Checkpoint:
		r.checkpoint(l.Index, rep)
	case OverlapFallback, Fed:
		job.Emit(r.Events, l.Index, rep)
	case job.Left:
		fmt.Fprintf(r.Out, "worker %d (pid %d) left the job on request\n", l.Index, rep.Pid)
	case job.Failed:
		job.Emit(r.Events, l.Index, rep)
		if r.failed != nil || r.done != nil {
			return nil
		}
		// A worker's own failure, told before it exits: it ends the job
		// now, not once the others have trained on without it.
		if rep.NonFinite != nil {
			r.failed = fmt.Errorf("worker %d failed: %w", l.Index, rep.NonFinite)
			r.killAt = time.After(nonFiniteGrace) // every rank fails this step: each says so and exits
			return nil
		}
		r.failed = fmt.Errorf("worker %d failed: %s", l.Index, rep.Reason)
		r.endFailed()
	case job.Stopped:
		if r.stop == nil {
			r.stop = &rep
			job.Emit(r.Events, l.Index, rep)
		}
	case Done:
		if r.done == nil && r.failed == nil { // a failed job is not done: its result and its error agree
			r.done = &rep
			job.Emit(r.Events, l.Index, rep)
		}
	}
	return nil
}

// nonFiniteGrace bounds how long a job whose step was not finite waits for
// its workers, which all fail that step, to say so and exit.
const nonFiniteGrace = time.Minute

// drainLines takes the report lines already written.
func (r *ringJob) drainLines() error {
	for {
		select {
		case l := <-r.Procs.Lines():
			if err := r.handle(l); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// endFailed ends a failed job: its coordinator, and its workers, which
// would wait for a coordinator that is gone.
func (r *ringJob) endFailed() {
	r.cancel()
	r.Procs.Signal("", syscall.SIGKILL)
}
