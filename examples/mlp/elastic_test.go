package mlp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// TestElasticResize: 4 ranks train, one is lost in the middle of a step, the
// 3 survivors roll back to their commit, rebuild the ring and go on; then two
// newcomers join and receive the state over the data plane. Every step's
// global batch is exactly the sampler's (checked by fingerprint, so no sample
// is lost or repeated), ranks stay bitwise identical, and the run ends within
// 1e-5 of one rank training the same steps undisturbed.
func TestElasticResize(t *testing.T) {
	data, err := Synthetic(2048, 784, 10, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	widths := []int{784, 32, 10}
	cfg := worker.Config{GlobalBatch: 200, Schedule: nn.Schedule{Base: 0.05}, Seed: 5}
	opt := nn.OptimizerConfig{Kind: "adam"}
	ctx := testContext(t)
	sampler, err := worker.NewSampler(data.Len(), cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	single := newRig(t, 1, data, cfg, opt, widths)
	multi := newRig(t, 4, data, cfg, opt, widths)
	for _, tr := range multi.trainers {
		tr.State().Commit()
	}
	var pos worker.Position
	check := func(step int, st1, st worker.StepStats, r *rig) {
		t.Helper()
		idx, _, _, err := sampler.Batch(pos, cfg.GlobalBatch, 1, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := worker.FingerprintOf(idx); st.Fingerprint != want {
			t.Fatalf("step %d: the ranks trained on samples with fingerprint %v, the sampler's batch is %v", step, st.Fingerprint, want)
		}
		pos = st.Position
		if math.Abs(st1.Loss-st.Loss) > 1e-4*st1.Loss {
			t.Errorf("step %d: loss %v undisturbed, %v elastic", step, st1.Loss, st.Loss)
		}
		ref := flat(r.models[0])
		for k := 1; k < len(r.models); k++ {
			for i, v := range flat(r.models[k]) {
				if math.Float32bits(v) != math.Float32bits(ref[i]) {
					t.Fatalf("step %d: rank %d parameter element %d differs from rank 0", step, k, i)
				}
			}
		}
	}
	step := 0
	run := func(r *rig, n int) {
		for range n {
			step++
			st1, errs := single.step(t, ctx)
			must(t, errs)
			st, errs := r.step(t, ctx)
			must(t, errs)
			check(step, st1, st, r)
		}
	}
	run(multi, 8)

	// Step 9: rank 2 dies after its peers computed their gradients.
	survivors := []int{0, 1, 3}
	errs := make([]error, len(survivors))
	var wg sync.WaitGroup
	for i, r := range survivors {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = multi.trainers[r].Step(ctx) }()
	}
	multi.groups[2].Abort("rank 2 killed by the test")
	waitWithin(t, &wg, "the survivors' step 9")
	for i, err := range errs {
		if !errors.Is(err, collective.ErrAborted) && !errors.Is(err, collective.ErrPeerLost) {
			t.Fatalf("rank %d: step 9 ended with %v, want the loss of rank 2", survivors[i], err)
		}
	}
	next := &rig{}
	for _, r := range survivors {
		next.models = append(next.models, multi.models[r])
		next.trainers = append(next.trainers, multi.trainers[r])
	}
	regroup(t, ctx, next, 2, nil)
	run(next, 6)

	// Two newcomers, fresh models with other weights, join at step 14.
	var fresh []*worker.Trainer
	for range 2 {
		m, err := New(widths, 99)
		if err != nil {
			t.Fatal(err)
		}
		o, err := nn.NewOptimizer(opt, m.Params())
		if err != nil {
			t.Fatal(err)
		}
		g0, err := collective.InprocGroups(ctx, 1, "fresh", 1, collective.Options{})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := worker.NewTrainer(ctx, g0[0], m, data, o, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close(); collective.CloseGroups(g0) })
		next.models = append(next.models, m)
		next.trainers = append(next.trainers, tr)
		fresh = append(fresh, tr)
	}
	regroup(t, ctx, next, 3, fresh)
	run(next, 8)

	a, b := flat(single.models[0]), flat(next.models[4])
	var diff, norm float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		diff += d * d
		norm += float64(a[i]) * float64(a[i])
	}
	if rel := math.Sqrt(diff / norm); rel > 1e-5 {
		t.Errorf("after %d steps the parameters differ by %.3g (relative) from an undisturbed run", step, rel)
	}
}

// regroup builds generation gen for r's trainers: survivors roll back, every
// trainer moves to the new ring, and Resync makes them equal.
func regroup(t *testing.T, ctx context.Context, r *rig, gen uint64, newcomers []*worker.Trainer) {
	t.Helper()
	groups, err := collective.InprocGroups(ctx, len(r.trainers), "mlp-test", gen, collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	isNew := map[*worker.Trainer]bool{}
	for _, tr := range newcomers {
		isNew[tr] = true
	}
	res := make([]worker.Resynced, len(r.trainers))
	errs := make([]error, len(r.trainers))
	var wg sync.WaitGroup
	for i, tr := range r.trainers {
		reached := tr.State().Step
		if !isNew[tr] {
			if _, err := tr.Rollback(); err != nil {
				t.Fatal(err)
			}
		}
		if err := tr.Rebind(groups[i]); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); res[i], errs[i] = tr.Resync(ctx, reached) }()
	}
	waitWithin(t, &wg, fmt.Sprintf("every rank's resync into generation %d", gen))
	must(t, errs)
	for i, x := range res {
		if x != res[0] || x.Redone != 0 {
			t.Fatalf("rank %d resynced to %+v, rank 0 to %+v; want equal and no step redone", i, x, res[0])
		}
		if isNew[r.trainers[x.Root]] {
			t.Fatalf("state taken from newcomer rank %d", x.Root)
		}
	}
	r.groups = groups
	t.Cleanup(func() { collective.CloseGroups(groups) })
}

// TestElasticKeepRankBatch: with KeepRankBatch, a ring that shrinks from 4
// to 2 keeps each rank's share (64 samples), so the global batch halves and
// the learning rate with it.
func TestElasticKeepRankBatch(t *testing.T) {
	data, err := Synthetic(2048, 784, 10, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.Config{GlobalBatch: 256, Schedule: nn.Schedule{Base: 0.08}, Seed: 5, KeepRankBatch: true, ReferenceWorld: 4}
	ctx := testContext(t)
	r := newRig(t, 4, data, cfg, nn.OptimizerConfig{Kind: "sgd"}, []int{784, 16, 10})
	for _, tr := range r.trainers {
		tr.State().Commit()
	}
	st, errs := r.step(t, ctx)
	must(t, errs)
	if st.Samples != 256 || math.Abs(float64(st.LR)-0.08) > 1e-7 {
		t.Fatalf("world 4: %d samples at lr %v, want 256 at 0.08", st.Samples, st.LR)
	}
	half := &rig{models: r.models[:2], trainers: r.trainers[:2]}
	for _, g := range r.groups[2:] {
		g.Abort("left")
	}
	regroup(t, ctx, half, 2, nil)
	st, errs = half.step(t, ctx)
	must(t, errs)
	if st.Samples != 128 || math.Abs(float64(st.LR)-0.04) > 1e-7 {
		t.Fatalf("world 2: %d samples at lr %v, want 128 at 0.04", st.Samples, st.LR)
	}
}
