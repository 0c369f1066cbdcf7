package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// blobs is a small deterministic classification set.
type blobs struct {
	x []float32
	y []int32
}

const blobFeatures, blobClasses = 8, 3

func newBlobs(n int) *blobs {
	rng := rand.New(rand.NewPCG(11, 12))
	b := &blobs{x: make([]float32, n*blobFeatures), y: make([]int32, n)}
	for i := range n {
		c := rng.IntN(blobClasses)
		b.y[i] = int32(c)
		for f := range blobFeatures {
			b.x[i*blobFeatures+f] = float32(rng.NormFloat64()*0.5) + float32((c+f)%blobClasses)
		}
	}
	return b
}

func (b *blobs) Len() int { return len(b.y) }

func (b *blobs) Fill(idx []int, out *Batch) error {
	out.Reset(len(idx), blobFeatures)
	for k, i := range idx {
		copy(out.X[k*blobFeatures:], b.x[i*blobFeatures:(i+1)*blobFeatures])
		out.Labels[k] = b.y[i]
	}
	return nil
}

// tinyModel is Dense-ReLU-Dense with softmax cross-entropy; panicAt makes
// its Step panic once at that step.
type tinyModel struct {
	net     *nn.Sequential
	loss    nn.SoftmaxCrossEntropy
	step    int64
	panicAt int64
	panics  int
	delay   func(call int64) time.Duration // injected slowness, before the forward pass
	after   func(call int64) time.Duration // injected slowness, after the backward pass
}

func newTinyModel() *tinyModel {
	rng := rand.New(rand.NewPCG(3, 4))
	return &tinyModel{net: nn.NewSequential(nn.NewDense("d1", blobFeatures, 16, rng), &nn.ReLU{}, nn.NewDense("d2", 16, blobClasses, rng))}
}

func (m *tinyModel) Params() []*nn.Param { return m.net.Params() }

func (m *tinyModel) Step(b *Batch, scale float32, ready func(int)) (Result, error) {
	m.step++
	if m.delay != nil {
		time.Sleep(m.delay(m.step)) // the injected fault, not a synchronisation
	}
	if m.step == m.panicAt && m.panics == 0 {
		m.panics++
		panic(fmt.Sprintf("injected failure in model code at call %d", m.step))
	}
	sum, correct, grad, err := m.loss.Loss(m.net.Forward(nn.Matrix{Rows: b.N, Cols: b.Features, Data: b.X}), b.Labels, scale)
	if err != nil {
		return Result{}, err
	}
	m.net.Backward(grad, ready)
	if m.after != nil {
		time.Sleep(m.after(m.step)) // the injected fault, once the first buckets are sent
	}
	return Result{LossSum: sum, Correct: correct}, nil
}

// actorJob runs world ranks as actors in one actor system under one
// supervisor, and returns every rank's final parameters.
func actorJob(t *testing.T, world int, steps int64, inject func(rank int, m *tinyModel, tr *Trainer)) ([][]float32, []*phalanxpb.RankRestarted) {
	t.Helper()
	return actorJobWith(t, world, steps, inject, nil, nil)
}

// actorJobWith is actorJob with a hybrid policy (nil: BSP) and a callback
// for every rank's steps.
func actorJobWith(t *testing.T, world int, steps int64, inject func(rank int, m *tinyModel, tr *Trainer), policy *hybrid.Policy,
	onStep func(rank int, st StepStats)) ([][]float32, []*phalanxpb.RankRestarted) {
	t.Helper()
	return actorJobOpts(t, world, steps, jobOptions{inject: inject, policy: policy, onStep: onStep})
}

// jobOptions are actorJobOpts's: a fault injection, a hybrid policy (nil:
// BSP), callbacks for every rank's steps and the group's overlap fallbacks,
// and the trainers' bucket size (0: the default).
type jobOptions struct {
	inject      func(rank int, m *tinyModel, tr *Trainer)
	policy      *hybrid.Policy
	onStep      func(rank int, st StepStats)
	onFallback  func(Fallback)
	bucketBytes int
}

// actorJobOpts is actorJob with options.
func actorJobOpts(t *testing.T, world int, steps int64, o jobOptions) ([][]float32, []*phalanxpb.RankRestarted) {
	t.Helper()
	inject, policy, onStep := o.inject, o.policy, o.onStep
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	groups, err := collective.InprocGroups(ctx, world, "actors", 1, collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer collective.CloseGroups(groups)
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	data := newBlobs(600)
	var mu sync.Mutex
	var restarts []*phalanxpb.RankRestarted
	groupPID := actor.NewPID(sys.Address(), "job/group")
	children := []actors.Child{{Name: "group", Props: NewGroupProps(GroupConfig{World: world, Generation: 1, Hybrid: policy, OnFallback: o.onFallback})}}
	models := make([]*tinyModel, world)
	done := make(chan error, world)
	for r := range world {
		models[r] = newTinyModel()
		opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "adam"}, models[r].Params())
		tr, err := NewTrainer(ctx, groups[r], models[r], data, opt, Config{GlobalBatch: 64, Schedule: nn.Schedule{Base: 0.01}, Seed: 9, BucketBytes: o.bucketBytes}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		if inject != nil {
			inject(r, models[r], tr)
		}
		children = append(children, actors.Child{Name: fmt.Sprintf("rank%d", r), Props: NewRankProps(RankConfig{
			Trainer: tr, Rank: r, Generation: 1, Steps: steps, Group: groupPID, Context: ctx, Hybrid: policy != nil,
			OnStep: func(st StepStats) {
				if onStep != nil {
					onStep(r, st)
				}
			},
			OnRestart: func(m *phalanxpb.RankRestarted) { mu.Lock(); restarts = append(restarts, m); mu.Unlock() },
			OnDone:    func(err error) { done <- err }})})
	}
	gaveUp := make(chan error, 1)
	if _, _, err := actors.StartSupervisor(sys, "job", &actors.Strategy{GiveUp: func(e *actors.GiveUpError) { gaveUp <- e }}, children...); err != nil {
		t.Fatal(err)
	}
	for range world {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case err := <-gaveUp:
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal("job did not finish")
		}
	}
	out := make([][]float32, world)
	for r, m := range models {
		for _, p := range m.Params() {
			out[r] = append(out[r], p.Value...)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return out, restarts
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestRankActorRestart: a rank actor that panics at a chosen step — in model
// code, or in the optimizer update — is restarted by its supervisor, resumes
// from the committed state, and the job ends with exactly the parameters of a
// run without the failure.
func TestRankActorRestart(t *testing.T) {
	const world, steps = 3, 12
	clean, none := actorJob(t, world, steps, nil)
	if len(none) != 0 {
		t.Fatalf("restarts in a clean run: %v", none)
	}
	for r := 1; r < world; r++ {
		if !sameBits(clean[0], clean[r]) {
			t.Fatalf("clean run: rank %d differs from rank 0", r)
		}
	}
	cases := []struct {
		name   string
		inject func(rank int, m *tinyModel, tr *Trainer)
	}{
		{"model panic", func(rank int, m *tinyModel, _ *Trainer) {
			if rank == 1 {
				m.panicAt = 5
			}
		}},
		{"optimizer panic", func(rank int, _ *tinyModel, tr *Trainer) {
			if rank == 2 {
				fired := false
				tr.beforeUpdate = func(step int64) {
					if step == 7 && !fired {
						fired = true
						panic("injected failure in the optimizer at step 7")
					}
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, restarts := actorJob(t, world, steps, tc.inject)
			if len(restarts) != 1 {
				t.Fatalf("%d restarts reported, want 1: %v", len(restarts), restarts)
			}
			for r := range world {
				if !sameBits(clean[r], got[r]) {
					t.Errorf("rank %d ends with other parameters than the run without the failure", r)
				}
			}
		})
	}
}

// TestRecoverUnrecoverable: a failure in the update without a commit at the
// step's start is reported, not papered over.
func TestRecoverUnrecoverable(t *testing.T) {
	ctx := testContext(t)
	groups, err := collective.InprocGroups(ctx, 1, "x", 1, collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer groups[0].Close()
	m := newTinyModel()
	opt, _ := nn.NewOptimizer(nn.OptimizerConfig{}, m.Params())
	tr, err := NewTrainer(ctx, groups[0], m, newBlobs(100), opt, Config{GlobalBatch: 10, CommitEvery: 5, Schedule: nn.Schedule{Base: 0.1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.beforeUpdate = func(step int64) {
		if step == 2 {
			panic("boom")
		}
	}
	if _, err := tr.Step(ctx); err != nil {
		t.Fatal(err)
	}
	var pe *PanicError
	if _, err := tr.Step(ctx); !errors.As(err, &pe) || pe.Step != 2 {
		t.Fatalf("step 2: %v, want a panic error", err)
	}
	if _, _, err := tr.Recover(ctx); !errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("recover: %v, want ErrUnrecoverable", err)
	}
}

// goCollector records the StepGo messages a fake rank receives.
type goCollector struct{ got chan<- *phalanxpb.StepGo }

func (c *goCollector) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*phalanxpb.StepGo); ok {
		c.got <- m
	}
}

// TestGroupActorRefusesStrangers: step-ready messages of another generation
// or of a rank outside the world do not count towards a hybrid step (whose
// first waits for every rank; the deadline is far). Each legitimate rank and
// the strangers answer from actors of their own: a stranger counted would
// close step 1 early, its decision going to the stranger and never to rank 1.
func TestGroupActorRefusesStrangers(t *testing.T) {
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	collector := func() (*phalanxpb.ActorRef, chan *phalanxpb.StepGo) {
		got := make(chan *phalanxpb.StepGo, 8)
		pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &goCollector{got: got} }))
		return &phalanxpb.ActorRef{Address: pid.Address, Id: pid.Id}, got
	}
	rank0, got0 := collector()
	rank1, got1 := collector()
	stranger, gotStranger := collector()
	group := sys.Root.Spawn(NewGroupProps(GroupConfig{World: 2, Generation: 5, Hybrid: &hybrid.Policy{Deadline: time.Minute, Quorum: 0.6}}))
	for _, m := range []*phalanxpb.StepReady{
		{Rank: 0, Step: 1, Generation: 5, From: rank0},
		{Rank: 1, Step: 1, Generation: 4, From: stranger}, // a dead generation
		{Rank: 7, Step: 1, Generation: 5, From: stranger}, // no such rank
		{Rank: 1, Step: 1, Generation: 5},                 // no sender
		{Rank: 1, Step: 2, Generation: 5, From: stranger}, // another step
		{Rank: 1, Step: 1, Generation: 5, From: rank1},    // completes step 1
	} {
		sys.Root.Send(group, m)
	}
	for r, got := range []chan *phalanxpb.StepGo{got0, got1} {
		select {
		case m := <-got:
			if m.Step != 1 || m.Generation != 5 || len(m.Participants) != 2 {
				t.Errorf("rank %d: decision %v", r, m)
			}
		case m := <-gotStranger:
			t.Fatalf("a stranger's readiness was counted: it got the decision %v", m)
		case <-time.After(10 * time.Second):
			t.Fatalf("rank %d: no decision for step 1", r)
		}
	}
}

// panicky is a SavingOptimizer that panics inside its update at one step,
// after changing the parameters: what an nn.SavingOptimizer must not do.
type panicky struct {
	nn.SavingOptimizer
	at int64
}

func (o *panicky) Update(params []*nn.Param, lr float32, step int64) {
	o.SavingOptimizer.Update(params, lr, step)
	if step == o.at {
		panic("boom inside the update")
	}
}

// TestUpdateCommitPaths: how the commit of a step's start survives the
// update — not copied at all (a SavingOptimizer committing every step),
// copied in the update's pass (committing every other step), copied first
// (any other optimizer) — every path gives the same parameters, and after
// a panic before the update (the live tensors still the commit's) a
// recovery re-applies the step to the same bits. The uncopied path leaves
// the commit's copy untouched, and a panic inside its update is reported
// unrecoverable rather than restored from a stale copy.
func TestUpdateCommitPaths(t *testing.T) {
	ctx := testContext(t)
	run := func(t *testing.T, commitEvery int, wrap func(nn.Optimizer) nn.Optimizer, panicBefore int64) (*Trainer, []float32) {
		groups, err := collective.InprocGroups(ctx, 1, "paths", 1, collective.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { collective.CloseGroups(groups) })
		m := newTinyModel()
		opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum"}, m.Params())
		tr, err := NewTrainer(ctx, groups[0], m, newBlobs(200), wrap(opt), Config{GlobalBatch: 20, CommitEvery: commitEvery, Schedule: nn.Schedule{Base: 0.1}, Seed: 3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.Close)
		fired := false
		tr.beforeUpdate = func(step int64) {
			if step == panicBefore && !fired {
				fired = true
				panic("boom before the update")
			}
		}
		for tr.State().Step < 6 {
			if _, err := tr.Step(ctx); err != nil {
				var pe *PanicError
				if !errors.As(err, &pe) {
					t.Fatal(err)
				}
				if _, _, err := tr.Recover(ctx); err != nil {
					t.Fatalf("recover after %v: %v", pe, err)
				}
			}
		}
		return tr, paramsOf(tr)
	}
	same := func(o nn.Optimizer) nn.Optimizer { return o }
	hide := func(o nn.Optimizer) nn.Optimizer { return struct{ nn.Optimizer }{o} } // not a SavingOptimizer
	uncopied, want := run(t, 1, same, 0)
	for _, tc := range []struct {
		name        string
		commitEvery int
		wrap        func(nn.Optimizer) nn.Optimizer
		panicBefore int64
	}{
		{"uncopied, a panic before the update", 1, same, 4},
		{"copied in the update's pass", 2, same, 0},
		{"copied in the update's pass, a panic before the update", 2, same, 5},
		{"copied first", 1, hide, 0},
		{"copied first, a panic before the update", 1, hide, 4},
	} {
		if _, got := run(t, tc.commitEvery, tc.wrap, tc.panicBefore); !sameBits(got, want) {
			t.Errorf("%s: parameters differ from the uncopied path's", tc.name)
		}
	}
	_, saved := uncopied.State().savedTensors()
	for i, x := range saved {
		for _, v := range x {
			if v != 0 {
				t.Fatalf("the uncopied path wrote the commit's copy (tensor %d)", i)
			}
		}
	}
	// A panic inside an uncopied update.
	groups, err := collective.InprocGroups(ctx, 1, "inside", 1, collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer collective.CloseGroups(groups)
	m := newTinyModel()
	opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum"}, m.Params())
	tr, err := NewTrainer(ctx, groups[0], m, newBlobs(200), &panicky{SavingOptimizer: opt.(nn.SavingOptimizer), at: 3},
		Config{GlobalBatch: 20, Schedule: nn.Schedule{Base: 0.1}, Seed: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for range 2 {
		if _, err := tr.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var pe *PanicError
	if _, err := tr.Step(ctx); !errors.As(err, &pe) {
		t.Fatalf("step 3: %v, want the panic", err)
	}
	if _, _, err := tr.Recover(ctx); !errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("recover inside an uncopied update: %v, want ErrUnrecoverable", err)
	}
	if _, err := tr.Rollback(); !errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("rollback inside an uncopied update: %v, want ErrUnrecoverable", err)
	}
}
