package worker

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// newHybridRanks builds world trainers over in-process groups.
func newHybridRanks(t *testing.T, world int, cfg Config) []*Trainer {
	t.Helper()
	ctx := testContext(t)
	groups, err := collective.InprocGroups(ctx, world, "hybrid", 1, collective.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { collective.CloseGroups(groups) })
	data := newBlobs(600)
	out := make([]*Trainer, world)
	for r := range world {
		m := newTinyModel()
		opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum"}, m.Params())
		tr, err := NewTrainer(ctx, groups[r], m, data, opt, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.Close)
		out[r] = tr
	}
	return out
}

func paramsOf(tr *Trainer) []float32 {
	var out []float32
	for _, p := range tr.params {
		out = append(out, p.Value...)
	}
	return out
}

// TestHybridSteps: steps where one rank is late (its compute running while
// the others reduce without it) or skips a step it never computed: every
// rank applies the same update, parameters stay bitwise identical, and the
// samples counted are only the contributors'. With everyone taking part, a
// hybrid step equals a synchronous one (to rounding: another summation
// order).
func TestHybridSteps(t *testing.T) {
	ctx := testContext(t)
	for _, stale := range []Stale{StaleDrop, StaleDecay} {
		cfg := Config{GlobalBatch: 60, Schedule: nn.Schedule{Base: 0.05}, Seed: 5, Stale: stale, StaleDecay: 0.5}
		ranks := newHybridRanks(t, 3, cfg)
		ref := newHybridRanks(t, 3, Config{GlobalBatch: 60, Schedule: nn.Schedule{Base: 0.05}, Seed: 5})
		// who takes part in each step; rank 2 is late in 3 and 6, and
		// skips step 4 (reduced while it still computed step 3).
		late := map[int64]bool{3: true, 4: true, 6: true}
		for step := int64(1); step <= 8; step++ {
			if step == 4 {
				continue // reduced together with step 3 below
			}
			var wg sync.WaitGroup
			errs := make([]error, 3)
			samples := make([]int, 3)
			for r, tr := range ranks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if r == 2 && late[step] {
						// Compute runs while the ring reduces without us.
						done := make(chan error, 1)
						go func() { done <- tr.Compute(ctx) }()
						errs[r] = tr.ReduceStep(ctx, step, false)
						if errs[r] == nil && step == 3 {
							errs[r] = tr.ReduceStep(ctx, 4, false) // step 4 closes before our compute ends
						}
						if err := <-done; err != nil && errs[r] == nil {
							errs[r] = err
						}
					} else {
						if errs[r] = tr.Compute(ctx); errs[r] == nil {
							errs[r] = tr.ReduceStep(ctx, step, true)
						}
						if errs[r] == nil && step == 3 { // step 4: ranks 0 and 1 compute and reduce it too
							if _, errs[r] = tr.ApplyStep(ctx); errs[r] == nil {
								if errs[r] = tr.Compute(ctx); errs[r] == nil {
									errs[r] = tr.ReduceStep(ctx, 4, true)
								}
							}
						}
					}
					for errs[r] == nil && tr.Pending() > 0 {
						var st StepStats
						st, errs[r] = tr.ApplyStep(ctx)
						samples[r] = st.Samples
					}
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("stale %d step %d rank %d: %v", stale, step, r, err)
				}
			}
			want := 60
			if late[step] {
				want = 40
			}
			if samples[0] != want || samples[2] != want {
				t.Fatalf("step %d: %v samples counted, want %d", step, samples, want)
			}
			a := paramsOf(ranks[0])
			for r := 1; r < 3; r++ {
				b := paramsOf(ranks[r])
				for i := range a {
					if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
						t.Fatalf("stale %d step %d: rank %d parameter %d differs", stale, step, r, i)
					}
				}
			}
			if ranks[2].State().Step != ranks[0].State().Step || ranks[2].State().Position != ranks[0].State().Position {
				t.Fatalf("step %d: rank 2 at %d/%+v, rank 0 at %d/%+v", step, ranks[2].State().Step, ranks[2].State().Position,
					ranks[0].State().Step, ranks[0].State().Position)
			}
		}
		// Steps 1 and 2 had everyone: equal to synchronous training.
		if stale == StaleDrop {
			mustSteps(t, ref, 2)
			fresh := newHybridRanks(t, 3, cfg)
			hybridAll(t, fresh, 2)
			a, b := paramsOf(ref[0]), paramsOf(fresh[0])
			for i := range a {
				if d := math.Abs(float64(a[i] - b[i])); d > 1e-6 {
					t.Fatalf("parameter %d: synchronous %v, hybrid %v", i, a[i], b[i])
				}
			}
		}
	}
}

func mustSteps(t *testing.T, ranks []*Trainer, n int) {
	t.Helper()
	ctx := testContext(t)
	for range n {
		var wg sync.WaitGroup
		for _, tr := range ranks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := tr.Step(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
}

func hybridAll(t *testing.T, ranks []*Trainer, n int) {
	t.Helper()
	ctx := testContext(t)
	for s := range n {
		var wg sync.WaitGroup
		for _, tr := range ranks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := tr.Compute(ctx); err != nil {
					t.Error(err)
					return
				}
				if err := tr.ReduceStep(ctx, int64(s+1), true); err != nil {
					t.Error(err)
					return
				}
				if _, err := tr.ApplyStep(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
}

// TestHybridActors: rank actors in hybrid mode with one rank far slower in
// a range of steps: steps close without it at the deadline, it catches up by
// joining reductions while it computes, and every rank ends with bitwise the
// same parameters and the same number of steps.
func TestHybridActors(t *testing.T) {
	policy := &hybrid.Policy{Deadline: 30 * time.Millisecond, Quorum: 0.6}
	if err := policy.Validate(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	partial := 0
	slow := func(rank int, m *tinyModel, _ *Trainer) {
		if rank == 2 {
			m.delay = func(call int64) time.Duration { // the injected straggler: calls 5 to 12 take 100 ms more
				if call >= 5 && call <= 12 {
					return 100 * time.Millisecond
				}
				return 0
			}
		}
	}
	params, _ := actorJobWith(t, 3, 20, slow, policy, func(rank int, st StepStats) {
		if rank == 0 && st.Samples < 64 {
			mu.Lock()
			partial++
			mu.Unlock()
		}
	})
	for r := 1; r < 3; r++ {
		if !sameBits(params[0], params[r]) {
			t.Fatalf("rank %d's parameters differ from rank 0's", r)
		}
	}
	// Calls 5 to 12 of rank 2 take 100 ms beyond a 30 ms deadline that the
	// others meet: at least one of those steps closes without it.
	if partial == 0 {
		t.Fatal("every step waited for the slow rank")
	}
	t.Logf("%d of 20 steps closed without every rank", partial)
}

// TestHybridActorsRestart: in hybrid mode a rank that panics — in its model
// code while late (its step closed without it and later steps are queued),
// or in the optimizer update of a step reduced while it was late — is
// restarted by its supervisor and goes on; every rank ends after every step
// with bitwise the same parameters.
func TestHybridActorsRestart(t *testing.T) {
	policy := &hybrid.Policy{Deadline: 30 * time.Millisecond, Quorum: 0.6}
	if err := policy.Validate(); err != nil {
		t.Fatal(err)
	}
	late := func(m *tinyModel) { // calls 5 to 12 take 100 ms more: steps close without the rank
		m.delay = func(call int64) time.Duration {
			if call >= 5 && call <= 12 {
				return 100 * time.Millisecond
			}
			return 0
		}
	}
	for _, tc := range []struct {
		name   string
		inject func(rank int, m *tinyModel, tr *Trainer)
	}{
		{"model panic while late", func(rank int, m *tinyModel, _ *Trainer) {
			if rank == 2 {
				late(m)
				m.panicAt = 8
			}
		}},
		{"optimizer panic while late", func(rank int, m *tinyModel, tr *Trainer) {
			if rank == 2 {
				late(m)
				fired := false
				tr.beforeUpdate = func(step int64) {
					if step == 9 && !fired {
						fired = true
						panic("injected failure in the optimizer at step 9")
					}
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			steps := make([]int64, 3)
			params, restarts := actorJobWith(t, 3, 20, tc.inject, policy, func(rank int, st StepStats) {
				mu.Lock()
				steps[rank] = st.Step
				mu.Unlock()
			})
			if len(restarts) != 1 || restarts[0].Rank != 2 || !strings.Contains(restarts[0].Reason, "injected failure") {
				t.Fatalf("restarts %v, want one of rank 2 with the injected failure", restarts)
			}
			for r := range 3 {
				if steps[r] != 20 {
					t.Errorf("rank %d ended at step %d, want 20", r, steps[r])
				}
				if !sameBits(params[0], params[r]) {
					t.Errorf("rank %d's parameters differ from rank 0's", r)
				}
			}
		})
	}
}

// TestHybridOverlapParams: a hybrid run with no straggler runs its steps
// overlapped once the ring has been on time for OverlapAfter steps, and
// ends with bitwise the parameters of the bulk-synchronous run (every rank
// takes part, the buckets are the same and reduced in the same order).
func TestHybridOverlapParams(t *testing.T) {
	const world, steps = 3, 12
	bsp, _ := actorJob(t, world, steps, nil)
	policy := &hybrid.Policy{Deadline: 10 * time.Second, Quorum: 0.6, OverlapAfter: 2}
	if err := policy.Validate(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	overlapped := make([][]bool, world)
	params, _ := actorJobOpts(t, world, steps, jobOptions{policy: policy, onStep: func(rank int, st StepStats) {
		mu.Lock()
		defer mu.Unlock()
		overlapped[rank] = append(overlapped[rank], st.Overlapped)
		if !st.Participated || st.Participants != world {
			t.Errorf("rank %d step %d: participated %v, %d participants: want every rank in every step", rank, st.Step, st.Participated, st.Participants)
		}
	}})
	for r := range world {
		if !sameBits(params[r], bsp[0]) {
			t.Fatalf("rank %d: hybrid parameters differ from the bulk-synchronous run's", r)
		}
		// Step 1 opens the generation, steps 2 and 3 are the on-time
		// streak; every step after is overlapped.
		for s, ov := range overlapped[r] {
			if want := s+1 > 3; ov != want {
				t.Fatalf("rank %d: step %d overlapped %v, want %v (all: %v)", r, s+1, ov, want, overlapped[r])
			}
		}
	}
}

// TestHybridRankActorOverlap: a hybrid rank actor sends its buckets during
// the backward pass of a step the group announced overlapped — they are
// reduced by the time the rank reports ready, with no decision — and of
// other steps sends none before the step closes.
func TestHybridRankActorOverlap(t *testing.T) {
	ranks, _ := overlapRanks(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sys, got := spawnRankActors(t, ctx, ranks, func(c *RankConfig) { c.Hybrid = true })
	modes := []bool{false, true, false} // whether steps 1, 2 and 3 are overlapped
	for step, overlap := range modes {
		pids := make([]*actor.PID, len(ranks))
		for range ranks {
			select {
			case msg := <-got:
				m, ok := msg.(*phalanxpb.StepReady)
				if !ok {
					t.Fatalf("the group got %T %v, want a step-ready message", msg, msg)
				}
				if m.Step != int64(step+1) {
					t.Fatalf("ready for step %d, want %d", m.Step, step+1)
				}
				pids[m.Rank] = actor.NewPID(m.From.Address, m.From.Id)
			case <-ctx.Done():
				t.Fatal("no readiness")
			}
		}
		for r, tr := range ranks {
			err := tr.fuser.Wait(ctx)
			switch {
			case overlap && err != nil:
				t.Fatalf("step %d rank %d: the overlapped step's reductions: %v", step+1, r, err)
			case !overlap && (err == nil || !strings.Contains(err.Error(), "not marked ready")):
				t.Fatalf("step %d rank %d, not overlapped: %v, want the buckets not sent", step+1, r, err)
			}
		}
		if step == len(modes)-1 {
			break // no decision: the trainers are closed while the actors wait
		}
		for _, pid := range pids { // the decision; the next step is overlapped if the list says so
			sys.Root.Send(pid, &phalanxpb.StepGo{Step: int64(step + 1), Generation: 1, Participants: []uint32{0, 1}, OverlapNext: step == 0})
		}
	}
}

// TestHybridOverlapStraggler: a rank turns slow in an overlapped step —
// before it sent a bucket (it withdraws: the step closes without it and its
// gradients are dropped) or after (it cannot be taken out of the sum: the
// step waits for it). Either way the step is a fallback, the next steps
// close at the deadline without the slow rank, overlap resumes once it is on
// time again, and every rank ends with bitwise the same parameters.
func TestHybridOverlapStraggler(t *testing.T) {
	slow := func(call int64) time.Duration { // calls 8 to 10 miss the deadline three times over
		if call >= 8 && call <= 10 {
			return 600 * time.Millisecond
		}
		return 0
	}
	for _, tc := range []struct {
		name        string
		afterBucket bool
	}{{"before its first bucket", false}, {"after its first bucket", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const world, steps = 3, 30
			policy := &hybrid.Policy{Deadline: 200 * time.Millisecond, Quorum: 0.6, OverlapAfter: 2}
			if err := policy.Validate(); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var fallbacks []Fallback
			stats := make([][]StepStats, world)
			o := jobOptions{policy: policy,
				onStep:     func(rank int, st StepStats) { mu.Lock(); stats[rank] = append(stats[rank], st); mu.Unlock() },
				onFallback: func(f Fallback) { mu.Lock(); fallbacks = append(fallbacks, f); mu.Unlock() },
				inject: func(rank int, m *tinyModel, _ *Trainer) {
					if rank == 2 && tc.afterBucket {
						m.after = slow
					} else if rank == 2 {
						m.delay = slow
					}
				}}
			if tc.afterBucket {
				o.bucketBytes = 64 // three chunks: the first is sent half-way through the backward pass
			}
			params, _ := actorJobOpts(t, world, steps, o)
			mu.Lock()
			defer mu.Unlock()
			for r := range world {
				if len(stats[r]) != steps || !sameBits(params[0], params[r]) {
					t.Fatalf("rank %d: %d steps, parameters equal to rank 0's %v", r, len(stats[r]), sameBits(params[0], params[r]))
				}
			}
			if len(fallbacks) == 0 || !slices.Equal(fallbacks[0].Late, []uint32{2}) {
				t.Fatalf("fallbacks %+v, want the slow rank 2 late in an overlapped step", fallbacks)
			}
			first := stats[0][fallbacks[0].Step-1]
			if !first.Overlapped || first.Participants != map[bool]int{false: 2, true: 3}[tc.afterBucket] {
				t.Fatalf("the fallback step %d: overlapped %v, %d participants", first.Step, first.Overlapped, first.Participants)
			}
			partial, dropped, resumed := 0, 0, false
			for s, st := range stats[0] {
				if st.Participants < world {
					partial++
					if st.Overlapped && int64(s+1) != fallbacks[0].Step {
						t.Errorf("step %d closed without a rank and overlapped, not a fallback", s+1)
					}
				}
				out := 0 // ranks whose gradients of step s+1 were dropped
				for r := range world {
					if !stats[r][s].Participated {
						out++
					}
				}
				if st.Participants != world-out {
					t.Errorf("step %d: %d participants, %d of %d ranks left out", s+1, st.Participants, out, world)
				}
				if out > 0 {
					dropped++
				}
				resumed = resumed || st.Overlapped && int64(s+1) > fallbacks[len(fallbacks)-1].Step
			}
			if partial == 0 || partial != dropped || !resumed {
				t.Fatalf("%d steps closed without a rank, ranks left out of %d; overlap resumed %v", partial, dropped, resumed)
			}
			t.Logf("%d fallbacks (first at step %d), %d of %d steps closed without the slow rank", len(fallbacks), fallbacks[0].Step, partial, steps)
		})
	}
}

// TestResyncLastIsTheStepAsTrained: a hybrid step that closed without rank
// 2 of a ring of 3, then a ring of 2 without it. Resync hands the new ring's
// rank 0 that step's figures as the old ring trained them (world 3, 2
// participants, generation 1, the fingerprint of ranks 0 and 1's shards of a
// three-way split): a reporter that never saw the step reports it again
// with them, and the chaos harness checks its samples against that split,
// not the new ring's.
func TestResyncLastIsTheStepAsTrained(t *testing.T) {
	ctx := testContext(t)
	cfg := Config{GlobalBatch: 60, Schedule: nn.Schedule{Base: 0.05}, Seed: 5}
	ranks := newHybridRanks(t, 3, cfg)
	hybridAll(t, ranks, 1)
	pos := ranks[0].State().Position
	var want Fingerprint
	for r := range 2 {
		idx, _, _, err := ranks[0].Sampler().Batch(pos, 60, 3, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range FingerprintOf(idx) {
			want[k] += v
		}
	}
	// Step 2 closes without rank 2, which never computes it.
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for r, tr := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r < 2 {
				if errs[r] = tr.Compute(ctx); errs[r] != nil {
					return
				}
			}
			if errs[r] = tr.ReduceStep(ctx, 2, r < 2); errs[r] == nil {
				_, errs[r] = tr.ApplyStep(ctx)
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("step 2, rank %d: %v", r, err)
		}
	}
	groups, err := collective.InprocGroups(ctx, 2, "hybrid", 2, collective.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { collective.CloseGroups(groups) })
	res := make([]Resynced, 2)
	for r, tr := range ranks[:2] {
		reached := tr.State().Step
		if _, err := tr.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := tr.Rebind(groups[r]); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); res[r], errs[r] = tr.Resync(ctx, reached) }()
	}
	wg.Wait()
	for r, err := range errs[:2] {
		if err != nil {
			t.Fatalf("resync, rank %d: %v", r, err)
		}
	}
	for r, x := range res {
		l := x.Last
		if l.Step != 2 || l.World != 3 || l.Participants != 2 || l.Generation != 1 || l.Samples != 40 || l.Fingerprint != want {
			t.Errorf("rank %d: the resynced last step is step %d, world %d, %d participants, generation %d, %d samples, fingerprint %v; "+
				"want step 2 as trained: world 3, 2 participants, generation 1, 40 samples, fingerprint %v",
				r, l.Step, l.World, l.Participants, l.Generation, l.Samples, l.Fingerprint, want)
		}
	}
}
