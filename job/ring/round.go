package ring

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/internal/plant"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/logical"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

// errLeaving ends a round at a step boundary once the worker was asked to
// leave.
var errLeaving = errors.New("phalanx: leaving the job")

// round trains in one generation: roll back to the last commit, move to the
// new ring, restore from a checkpoint or resync from the newest commit, then
// run the step protocol until the job's last step, the end of the round, or
// a failure.
func (w *ringWorker) round(ctx context.Context, r *elastic.Round) error {
	w.probeMu.Lock() // no probation step while in a ring
	defer w.probeMu.Unlock()
	g, gen := r.Group, r.Generation
	var reached int64
	t := w.currentTrainer()
	if t == nil {
		var err error
		if t, err = w.setup(g); err != nil {
			return err
		}
	} else {
		reached = t.State().Step
		if _, err := t.Rollback(); err != nil {
			return err
		}
		if err := t.Rebind(g); err != nil {
			return err
		}
		if plant.On(plant.SlowRecovery) {
			select { // planted: a survivor dawdles before it trains in the new ring
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
		}
	}
	ck := w.checkpointer()
	restored := false
	if ck != nil {
		ck.Bind(checkpoint.Ring{Group: g, Generation: gen.Number, Decided: gen.DecidedUnixNano})
		var err error
		if restored, err = w.restoreIfFresh(ctx, g, t, ck); err != nil {
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
		w.rep.Send(Restored{Generation: gen.Number, World: g.Size(), Step: res.Step, Redone: res.Redone, Root: res.Root,
			DataPlane: g.DataPlane()})
		if l := res.Last; l.Step > 0 && l.Step == res.Step { // in case the previous rank 0 never reported it
			w.rep.Send(replayedStep(l, gen.Number))
		}
	}
	w.rep.Send(job.Training{Generation: gen.Number, World: g.Size(), Rank: r.Rank, Step: res.Step})
	w.generation.Store(gen.Number)
	ids := make([]string, len(gen.Members))
	for i, m := range gen.Members {
		ids[i] = m.Id
	}
	w.sys.Root.Send(w.group, &worker.GroupRound{Generation: gen.Number, World: world, Members: ids})

	err := w.steps(ctx, r, t, ck)
	stopped := errors.Is(err, worker.ErrStopped)
	switch {
	case stopped && w.leaving.Load() && !w.stopAsked.Load():
		return errLeaving
	case stopped:
		w.stoppedAt.Store(t.State().Step)
		if r.Rank == 0 {
			w.rep.Send(job.Stopped{Step: t.State().Step, Generation: gen.Number, World: g.Size()})
		}
		w.sys.Quiet()
		return nil // every rank stops at this boundary: the job is over for now
	case err != nil:
		return err
	}
	res2, err := w.finish(ctx, g)
	if err != nil {
		return err
	}
	res2.Step, res2.Generation = t.State().Step, gen.Number
	if r.Rank == 0 {
		w.rep.Send(Done{Step: res2.Step, Generation: gen.Number, World: g.Size(), Loss: res2.Loss, Accuracy: res2.Accuracy,
			Identical: res2.ParametersIdentical, ParamsCRC: res2.ParametersCRC, RankCRCs: res2.RankCRCs, Metrics: res2.Metrics})
	}
	w.mu.Lock()
	w.result = res2
	w.mu.Unlock()
	w.sys.Quiet()         // peers' control planes go away from here on
	return g.Barrier(ctx) // no worker leaves while another still evaluates
}

// steps runs this generation's rank actor until the job's last step, a
// stop at a step boundary (worker.ErrStopped), or a failure.
func (w *ringWorker) steps(ctx context.Context, r *elastic.Round, t *worker.Trainer, ck *checkpoint.Checkpointer) error {
	g, gen, c := r.Group, r.Generation, &w.cfg
	hybridMode := c.Sync.Mode == "hybrid"
	c.Observe.Rank(r.Rank)
	c.Observe.Generation(gen.Number, g.Size())
	finished := make(chan error, 1)
	last := c.Steps
	if plant.On(plant.ShortJob) {
		last-- // planted: the job ends a step early
	}
	prev := c.Now()
	props := worker.NewRankProps(worker.RankConfig{
		Trainer: t, Rank: r.Rank, Generation: gen.Number, Steps: last, Context: ctx, Logger: w.log, Now: c.Now,
		Hybrid: hybridMode,
		Group:  actors.Ref(gen.Members[0].ControlAddr, "job/group"),
		Trace:  c.Tracer,
		OnDone: func(err error) { finished <- err },
		OnRestart: func(m *phalanxpb.RankRestarted) {
			w.rep.Send(Restart{Rank: int(m.Rank), Step: m.CommittedStep, Reason: m.Reason, Restarts: int(m.Restarts)})
		},
		AfterStep: func(st worker.StepStats) (bool, error) {
			var stop bool
			var err error
			if ck != nil { // on every rank at every boundary: its votes ride in the step's allreduce
				stop, err = ck.AfterStep(ctx, checkpoint.Progress{Step: st.Step, Epoch: st.Position.Epoch, Offset: st.Position.Offset,
					Loss: st.Loss, Accuracy: st.Accuracy, Samples: int64(st.Samples)}, st.Votes, st.Step >= c.Steps)
			}
			return stop || w.leaving.Load(), err
		},
		OnStep: func(st worker.StepStats) {
			now := c.Now()
			if m := c.Observe; m != nil {
				samples := 0
				if !hybridMode || st.Participated {
					samples = st.Samples / max(participants(st, g.Size()), 1)
				}
				m.Step(-1, st.Step, now.Sub(prev), samples, st.Loss)
			}
			c.Tracer.Flush()
			if r.Rank == 0 && hybridMode {
				w.publishPace(ctx, st.Step)
				w.serveFeeds(st.Step)
			}
			if r.Rank == 0 {
				n := participants(st, g.Size())
				if plant.On(plant.HybridUnrecorded) && n < g.Size() {
					n++ // planted: a late rank's samples dropped without a record
				}
				w.rep.Send(Step{Step: st.Step, Generation: gen.Number, World: g.Size(), Loss: st.Loss,
					Accuracy: st.Accuracy, SamplesPS: float64(st.Samples) / now.Sub(prev).Seconds(),
					ComputeS: st.Compute.Seconds(), CommS: st.Comm.Seconds(), StepS: now.Sub(prev).Seconds(),
					Epoch: st.Position.Epoch, Offset: st.Position.Offset, Fingerprint: st.Fingerprint,
					Participants: n, Stale: g.Size() - n})
			}
			prev = now
		},
	})
	pid, err := w.sup.Spawn(ctx, actors.Child{Name: fmt.Sprintf("rank-g%d", gen.Number), Props: props})
	if err != nil {
		return err
	}
	select {
	case err = <-finished:
	case e := <-w.sup.GaveUp():
		err = e
		// This worker's own failure: say so now, before it leaves the ring
		// (its lease revoked on the way out), so the launcher ends the job
		// before the others can train on without it and report it done.
		w.rep.Send(job.Failed{Reason: err.Error()})
	case <-g.Failed():
		err = g.Err()
	case <-ctx.Done():
		err = context.Cause(ctx)
	}
	var oe *collective.OpError
	if errors.As(err, &oe) && ctx.Err() == nil {
		// The group failed of itself (a timeout, a peer's abort or death,
		// a mismatch), not on a new generation: the hang recorder goes to
		// the launcher, which names the culprit from the survivors' dumps.
		w.rep.Send(job.Collectives{Rank: r.Rank, Generation: gen.Number, Reason: err.Error(), Ops: g.Recent()})
	}
	if err != nil && !errors.Is(err, worker.ErrStopped) {
		g.Abort(err.Error())
	}
	if serr := w.sup.Stop(pid); serr != nil {
		w.log.Warn("stopping the rank actor", zap.Error(serr))
	}
	// Stopped, the actor has ended what it was doing. A step that every
	// rank fails (not finite) is this rank's end even when a peer that
	// failed it first broke the ring before this rank could say so.
	select {
	case own := <-finished:
		if worker.IsNonFinite(own) {
			err = own
		}
	default:
	}
	return err
}

// finish scores the model on the held-out data and checks that every rank
// holds the same parameters.
func (w *ringWorker) finish(ctx context.Context, g *collective.Group) (*job.Result, error) {
	res := &job.Result{World: g.Size()}
	if ev, ok := w.task.Model.(worker.Evaluator); ok && w.task.Test != nil {
		var err error
		if res.Loss, res.Accuracy, err = evaluate(ctx, g, ev, w.task.Test); err != nil {
			return nil, err
		}
		if w.task.Measures != nil {
			res.Metrics = w.task.Measures(res.Loss, res.Accuracy)
		}
	}
	same, crcs, err := parametersAgree(ctx, g, w.params)
	if err != nil {
		return nil, err
	}
	res.ParametersIdentical, res.ParametersCRC, res.RankCRCs = same, crcs[g.Rank()], crcs
	return res, nil
}

// publishPace writes the ring's step, deadline and overhead every five
// steps: what excluded workers measure themselves against.
func (w *ringWorker) publishPace(ctx context.Context, step int64) {
	if step-w.progressAt.Load() < 5 {
		return
	}
	w.progressAt.Store(step)
	pace := &phalanxpb.Pace{Step: step, DeadlineNanos: w.paceDead.Load(), OverheadNanos: w.paceOver.Load()}
	go func() { // not on the rank actor's goroutine
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := w.coord.WritePace(pctx, pace); err != nil && pctx.Err() == nil {
			w.log.Warn("publishing the ring's pace", zap.Error(err))
		}
	}()
}

// setup builds the trainer (and checkpointer) in the first round this
// worker trains, around the task's model wrapped in the injected faults.
func (w *ringWorker) setup(g *collective.Group) (*worker.Trainer, error) {
	c := &w.cfg
	model := w.task.Model
	var faulty *faultyModel
	if c.Faults.FailWorker >= 0 && c.Faults.FailWorker == c.Index {
		faulty = &faultyModel{Model: model, at: c.Faults.FailStep, times: c.Faults.FailTimes}
		model = faulty
	}
	var inj *injectedModel
	if in := c.Faults.Inject; len(in.Slow)+len(in.Pause)+len(in.WrongOp) > 0 {
		inj = &injectedModel{Model: model, in: in, paused: -1, wrong: -1, probeStep: &w.probeStep}
		model = inj
	}
	params := model.Params()
	opt, err := nn.NewOptimizer(c.Optimizer, params)
	if err != nil {
		return nil, err
	}
	cfg := worker.Config{GlobalBatch: c.Batch, MicroBatches: c.MicroBatches, LocalSteps: c.LocalSteps, ClipNorm: c.ClipNorm,
		CommitEvery: c.CommitEvery, BucketBytes: c.BucketBytes, Schedule: c.LRSchedule(), Seed: c.Seed,
		KeepRankBatch: c.Rescale == "lr", ReferenceWorld: c.ReferenceWorld, StaleDecay: c.Sync.StaleDecay,
		Wire: c.WireDType.Collective(), ErrorFeedback: c.ErrorFeedback}
	if c.Sync.Stale == "decay" {
		cfg.Stale = worker.StaleDecay
	}
	t, err := worker.NewTrainer(w.runCtx, g, model, w.task.Train, opt, cfg, w.log)
	if err != nil {
		return nil, err
	}
	t.SetTrace(c.Tracer)
	if faulty != nil {
		faulty.trainer = t
	}
	if inj != nil {
		inj.trainer = t
	}
	t.State().Commit() // step 0: a candidate like any other, the same on every fresh worker
	var ck *checkpoint.Checkpointer
	if w.store != nil {
		if ck, err = w.newCheckpointer(params, opt); err != nil {
			return nil, err
		}
		t.SetVoter(ck.Votes)
	}
	w.mu.Lock()
	w.trainer, w.params, w.slots, w.ckpt = t, params, opt.Slots(), ck
	w.mu.Unlock()
	if ck != nil && w.stopAsked.Load() { // a request that came before ck was published
		ck.RequestStop()
	}
	return t, nil
}

// newCheckpointer saves and restores the trainer's state: the parameters,
// then the optimizer's slots, the order of worker.State.
func (w *ringWorker) newCheckpointer(params []*nn.Param, opt nn.Optimizer) (*checkpoint.Checkpointer, error) {
	slots := opt.Slots()
	tensors := stateTensors(params, slots)
	c := &w.cfg
	configHash, stateHash := checkpointHashes(c, params, slots)
	k := c.Checkpoint
	return checkpoint.New(checkpoint.Config{Store: w.store, Job: c.Job, ConfigHash: configHash, StateHash: stateHash,
		Model: c.Model, ModelOptions: c.ModelOptions, Seed: c.Seed, EverySteps: k.EverySteps, Every: k.Every,
		Retention: checkpoint.Retention{KeepLast: k.KeepLast, KeepEvery: k.KeepEvery}, Wait: k.Wait,
		SingleWriter: c.LocalSteps > 1, Logger: w.log.Named("checkpoint"), Now: c.Now,
		OnEvent: func(ev checkpoint.Event) { w.rep.Send(checkpointReport(ev)) }, Trace: c.Tracer}, tensors)
}

// stateTensors is what a ring worker checkpoints, in order: the
// parameters, then the optimizer's slots.
func stateTensors(params []*nn.Param, slots []nn.Tensor) []checkpoint.Tensor {
	var tensors []checkpoint.Tensor
	for _, p := range params {
		tensors = append(tensors, checkpoint.Tensor{Name: p.Name, Shape: shape64(p.Shape), Role: "parameter", Data: p.Value})
	}
	for _, s := range slots {
		tensors = append(tensors, checkpoint.Tensor{Name: s.Name, Shape: shape64(s.Shape), Role: "optimizer", Data: s.Data})
	}
	return tensors
}

// restoreIfFresh loads the newest checkpoint when no rank of the ring has
// trained yet (a job started or restarted from storage); a ring with any
// trained state resumes from memory instead, which is never older.
func (w *ringWorker) restoreIfFresh(ctx context.Context, g *collective.Group, t *worker.Trainer, ck *checkpoint.Checkpointer) (bool, error) {
	committed, _ := t.State().Committed()
	v := []float64{float64(committed)}
	if err := g.AllReduce(ctx, collective.Float64s(v), collective.Max); err != nil {
		return false, fmt.Errorf("checking for trained state: %w", err)
	}
	if v[0] > 0 {
		return false, nil
	}
	if ok, err := w.restoreIndexed(ctx, g, t, ck); ok || err != nil {
		return ok, err
	}
	res, err := ck.Restore(ctx, w.cfg.Checkpoint.Resume)
	if err != nil || res == nil {
		return false, err
	}
	m := res.Manifest
	return true, t.Restored(m.Step, worker.Position{Epoch: m.Epoch, Offset: m.Offset})
}

// restoreIndexed resumes the ring from an index of parts (a split or
// staged run's checkpoint of the same model, package logical) when the
// store's newest verified one is of a later step than its newest ring
// checkpoint: rank 0 chooses and sends its name, and every rank reads the
// logical tensors from the parts.
func (w *ringWorker) restoreIndexed(ctx context.Context, g *collective.Group, t *worker.Trainer, ck *checkpoint.Checkpointer) (bool, error) {
	var name []byte
	hdr := []float64{0} // the name's length; -1: rank 0 failed
	if g.Rank() == 0 {
		chosen, err := w.newerIndex(ctx)
		switch {
		case err != nil:
			name, hdr[0] = []byte(err.Error()), -1
		case chosen != "":
			name = []byte(chosen)
		}
		if hdr[0] == 0 {
			hdr[0] = float64(len(name))
		}
	}
	if err := g.Broadcast(ctx, collective.Float64s(hdr), 0); err != nil {
		return false, fmt.Errorf("checkpoint: choosing the checkpoint to resume from: %w", err)
	}
	n := int(hdr[0])
	if hdr[0] < 0 {
		n = 4096 // the error's text, bounded
	}
	if n > 4096 {
		return false, fmt.Errorf("checkpoint: rank 0 announced an index name of %d bytes", n)
	}
	if g.Rank() != 0 {
		name = make([]byte, n)
	} else if len(name) > n { // an error's text, cut
		name = name[:n]
	} else {
		name = append(name, make([]byte, n-len(name))...)
	}
	if n > 0 {
		if err := g.Broadcast(ctx, collective.Bytes(name), 0); err != nil {
			return false, fmt.Errorf("checkpoint: receiving the index's name: %w", err)
		}
	}
	switch {
	case hdr[0] < 0:
		return false, fmt.Errorf("checkpoint: %s", strings.TrimRight(string(name), "\x00"))
	case n == 0:
		return false, nil
	}
	src, err := w.readIndexed(ctx, string(name))
	// Every rank restores, or none: the ring agrees on what each found.
	failed := []float64{0}
	if err != nil {
		failed[0] = 1
	}
	if aerr := g.AllReduce(ctx, collective.Float64s(failed), collective.Max); aerr != nil {
		return false, fmt.Errorf("checkpoint: agreeing on the restore from %s: %w", name, aerr)
	}
	switch {
	case err != nil:
		return false, err
	case failed[0] > 0:
		return false, fmt.Errorf("checkpoint: another rank could not restore from %s (it says why)", name)
	}
	x := src.Index
	ck.Resumed(x.Step)
	if g.Rank() == 0 {
		w.rep.Send(checkpointReport(checkpoint.Event{Kind: "restored", ID: src.ID, Step: x.Step, URL: w.store.Location(),
			WorldBefore: x.Stages, WorldAfter: g.Size()}))
		w.log.Info("resumed from an index of parts", zap.String("index", src.ID), zap.Int64("step", x.Step), zap.Int("parts", src.Parts()))
	}
	return true, t.Restored(x.Step, worker.Position{Epoch: x.Epoch, Offset: x.Offset})
}

// readIndexed loads the worker's parameters and optimizer slots from index
// name, which rank 0 verified wholly (each read here checks what it reads).
func (w *ringWorker) readIndexed(ctx context.Context, name string) (*logical.Source, error) {
	src, err := logical.IndexSource(ctx, w.store, name)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: resuming from %s: %w", name, err)
	}
	tensors := stateTensors(w.params, w.slots)
	if err := src.Load(ctx, tensors, logical.Shapes(tensors), nil); err != nil {
		return nil, fmt.Errorf("checkpoint: resuming from %s: %w", name, err)
	}
	return src, nil
}

// newerIndex is the name of the store's newest verified index of parts of
// this job's state when it is of a later step than every complete ring
// checkpoint there ("" otherwise).
func (w *ringWorker) newerIndex(ctx context.Context) (string, error) {
	c := &w.cfg
	src, err := logical.NewestIndex(ctx, w.store, logical.StateHash(c.Model, c.ModelOptions, c.Optimizer.Kind, c.Seed), func(name string, err error) {
		w.log.Warn("skipping an index of parts that does not verify", zap.String("index", name), zap.Error(err))
		w.rep.Send(checkpointReport(checkpoint.Event{Kind: "skipped", ID: name, Err: err.Error()}))
	})
	if err != nil || src == nil {
		return "", err
	}
	infos, err := checkpoint.List(ctx, w.store)
	if err != nil {
		return "", fmt.Errorf("listing %s: %w", w.store.Location(), err)
	}
	for _, in := range infos {
		if in.Complete && in.Step >= src.Index.Step {
			return "", nil
		}
	}
	return src.ID, nil
}

// evaluate scores the model on every rank's share of data and combines
// them.
func evaluate(ctx context.Context, g *collective.Group, m worker.Evaluator, data worker.Dataset) (loss, acc float64, err error) {
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
	n := float64(max(data.Len(), 1))
	return sums[0] / n, sums[1] / n, nil
}

// parametersAgree checks that every rank holds bitwise the same parameters:
// each rank puts the CRC32C of its own in its slot of a vector the ranks
// sum (exact in float64), so every rank learns every rank's checksum. It
// returns whether they are all equal, and them by rank.
func parametersAgree(ctx context.Context, g *collective.Group, params []*nn.Param) (bool, []uint32, error) {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, p := range params {
		h.Write(collective.Float32s(p.Value).Raw())
	}
	v := make([]float64, g.Size())
	v[g.Rank()] = float64(h.Sum32())
	if err := g.AllReduce(ctx, collective.Float64s(v), collective.Sum); err != nil {
		return false, nil, fmt.Errorf("comparing the ranks' parameters: %w", err)
	}
	crcs := make([]uint32, len(v))
	same := true
	for r, x := range v {
		crcs[r] = uint32(x)
		same = same && crcs[r] == crcs[0]
	}
	return same, crcs, nil
}

// replayedStep is the report of a step trained before a ring change, sent
// again by rank 0 of generation gen: its world, generation and
// participants are the ring's that trained it (the sampler split its batch
// that many ways), not the new ring's.
func replayedStep(l worker.StepStats, gen uint64) Step {
	n := participants(l, l.World)
	return Step{Replayed: true, Step: l.Step, Generation: gen, TrainedIn: l.Generation, World: l.World, Loss: l.Loss,
		Accuracy: l.Accuracy, Epoch: l.Position.Epoch, Offset: l.Position.Offset, Fingerprint: l.Fingerprint,
		Participants: n, Stale: l.World - n}
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

// checkpointReport tells of a checkpoint event, its step at the top level
// as every report's.
func checkpointReport(ev checkpoint.Event) job.Checkpoint {
	return job.Checkpoint{Step: ev.Step, Checkpoint: ev}
}
