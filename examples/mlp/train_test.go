package mlp

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// rig is a job of world in-process ranks, each with its own model and trainer.
type rig struct {
	groups   []*collective.Group
	models   []*Model
	trainers []*worker.Trainer
}

func newRig(t *testing.T, world int, data worker.Dataset, cfg worker.Config, opt nn.OptimizerConfig, widths []int) *rig {
	t.Helper()
	ctx := testContext(t) // the trainers' background allreduces keep it
	groups, err := collective.InprocGroups(ctx, world, "mlp-test", 1, collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{groups: groups}
	for _, g := range groups {
		m, err := New(widths, 7)
		if err != nil {
			t.Fatal(err)
		}
		o, err := nn.NewOptimizer(opt, m.Params())
		if err != nil {
			t.Fatal(err)
		}
		tr, err := worker.NewTrainer(ctx, g, m, data, o, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.models = append(r.models, m)
		r.trainers = append(r.trainers, tr)
	}
	t.Cleanup(func() {
		for _, tr := range r.trainers {
			tr.Close()
		}
		collective.CloseGroups(r.groups)
	})
	return r
}

// step runs one step on every rank and returns rank 0's stats.
func (r *rig) step(t *testing.T, ctx context.Context) (worker.StepStats, []error) {
	t.Helper()
	stats := make([]worker.StepStats, len(r.trainers))
	errs := make([]error, len(r.trainers))
	var wg sync.WaitGroup
	for i, tr := range r.trainers {
		wg.Add(1)
		go func() { defer wg.Done(); stats[i], errs[i] = tr.Step(ctx) }()
	}
	waitWithin(t, &wg, "every rank's step")
	return stats[0], errs
}

// testWait bounds every wait of a test, and testContext its blocking
// calls: far above what a loaded machine needs, far below go test's
// timeout.
const testWait = 2 * time.Minute

// testContext ends with the test, and after testWait at the latest, so
// that a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB) context.Context { return testwait.Context(t, testWait) }

// waitWithin waits for wg, failing the test, naming what it waited for,
// after testWait.
func waitWithin(t testing.TB, wg *sync.WaitGroup, what string) {
	t.Helper()
	testwait.Wait(t, wg, testWait, what)
}

func must(t *testing.T, errs []error) {
	t.Helper()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func flat(m *Model) []float32 {
	var out []float32
	for _, p := range m.Params() {
		out = append(out, p.Value...)
	}
	return out
}

// TestDataParallelEquivalence: 4 ranks with a global batch of 256 end within
// 1e-5 (relative) of one rank with batch 256 on the same data order, with
// parameters bitwise identical across ranks after every step.
func TestDataParallelEquivalence(t *testing.T) {
	data, err := Synthetic(4096, 784, 10, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	widths := []int{784, 64, 10}
	cfg := worker.Config{GlobalBatch: 256, Schedule: nn.Schedule{Base: 0.05}, Seed: 3}
	opt := nn.OptimizerConfig{Kind: "momentum"}
	ctx := testContext(t)
	single := newRig(t, 1, data, cfg, opt, widths)
	multi := newRig(t, 4, data, cfg, opt, widths)
	var first, last worker.StepStats
	for s := range 50 {
		st1, errs := single.step(t, ctx)
		must(t, errs)
		st4, errs := multi.step(t, ctx)
		must(t, errs)
		if math.Abs(st1.Loss-st4.Loss) > 1e-4*st1.Loss {
			t.Errorf("step %d: loss %v with 1 rank, %v with 4", s+1, st1.Loss, st4.Loss)
		}
		ref := flat(multi.models[0])
		for r := 1; r < 4; r++ {
			for i, v := range flat(multi.models[r]) {
				if math.Float32bits(v) != math.Float32bits(ref[i]) {
					t.Fatalf("step %d: rank %d parameter element %d differs from rank 0", s+1, r, i)
				}
			}
		}
		if s == 0 {
			first = st4
		}
		last = st4
	}
	a, b := flat(single.models[0]), flat(multi.models[0])
	var diff, norm float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		diff += d * d
		norm += float64(a[i]) * float64(a[i])
	}
	if rel := math.Sqrt(diff / norm); rel > 1e-5 {
		t.Errorf("after 50 steps the parameters differ by %.3g (relative), want ≤ 1e-5", rel)
	}
	if last.Loss >= first.Loss {
		t.Errorf("loss went from %v to %v: not learning", first.Loss, last.Loss)
	}
}

// TestTrainerModes: gradient accumulation gives the same step as one big
// micro-batch; local SGD keeps ranks equal after each averaging.
func TestTrainerModes(t *testing.T) {
	data, err := Synthetic(1024, 784, 10, 2, 1)
	if err != nil {
		t.Fatal(err)
	}
	widths := []int{784, 32, 10}
	opt := nn.OptimizerConfig{Kind: "adamw", WeightDecay: 0.01}
	ctx := testContext(t)
	base := worker.Config{GlobalBatch: 128, Schedule: nn.Schedule{Base: 1e-3}, Seed: 5}
	accum := base
	accum.MicroBatches = 4
	plain, acc := newRig(t, 2, data, base, opt, widths), newRig(t, 2, data, accum, opt, widths)
	for range 5 {
		_, errs := plain.step(t, ctx)
		must(t, errs)
		_, errs = acc.step(t, ctx)
		must(t, errs)
	}
	a, b := flat(plain.models[0]), flat(acc.models[0])
	for i := range a {
		if d := math.Abs(float64(a[i] - b[i])); d > 1e-5*(1+math.Abs(float64(a[i]))) {
			t.Fatalf("accumulation over 4 micro-batches: element %d is %v, without %v", i, b[i], a[i])
		}
	}

	local := base
	local.LocalSteps = 3
	l := newRig(t, 3, data, local, nn.OptimizerConfig{Kind: "sgd"}, widths)
	for s := 1; s <= 6; s++ {
		_, errs := l.step(t, ctx)
		must(t, errs)
		equal := true
		x, y := flat(l.models[0]), flat(l.models[1])
		for i := range x {
			equal = equal && x[i] == y[i]
		}
		if s%3 == 0 && !equal {
			t.Errorf("local SGD step %d: ranks differ right after parameter averaging", s)
		}
		if s%3 != 0 && equal {
			t.Errorf("local SGD step %d: ranks equal between averagings: gradients were averaged", s)
		}
	}
}

// nanModel poisons one gradient at a chosen step.
type nanModel struct {
	*Model
	at, step int
}

func (m *nanModel) Step(b *worker.Batch, scale float32, ready func(int)) (worker.Result, error) {
	m.step++
	if m.step != m.at || ready == nil {
		return m.Model.Step(b, scale, ready)
	}
	return m.Model.Step(b, scale, func(p int) {
		if p == 2 {
			m.Params()[2].Grad[5] = float32(math.NaN())
		}
		ready(p)
	})
}

// TestNaNGradient: a NaN gradient on one rank fails the step on every rank
// with an error naming the step and the parameter.
func TestNaNGradient(t *testing.T) {
	data, err := Synthetic(512, 784, 10, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, 2, data, worker.Config{GlobalBatch: 64, Schedule: nn.Schedule{Base: 0.01}}, nn.OptimizerConfig{}, []int{784, 16, 10})
	poisoned := &nanModel{Model: r.models[1], at: 3}
	o, _ := nn.NewOptimizer(nn.OptimizerConfig{}, poisoned.Params())
	r.trainers[1].Close()
	ctx := testContext(t)
	r.trainers[1], err = worker.NewTrainer(ctx, r.groups[1], poisoned, data, o, worker.Config{GlobalBatch: 64, Schedule: nn.Schedule{Base: 0.01}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 3; s++ {
		_, errs := r.step(t, ctx)
		if s < 3 {
			must(t, errs)
			continue
		}
		for rank, err := range errs {
			var nf *worker.NonFiniteError
			if !errors.As(err, &nf) || nf.Step != 3 || nf.Param != "dense2.W" {
				t.Errorf("rank %d: %v, want a non-finite gradient of dense2.W at step 3", rank, err)
			}
		}
	}
}
