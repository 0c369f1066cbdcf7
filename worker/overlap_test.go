package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/nn"
)

// overlapRanks builds two trainers of linearModel (two gradient chunks)
// over in-process groups.
func overlapRanks(t *testing.T) ([]*Trainer, []*linearModel) {
	t.Helper()
	ctx := testContext(t)
	groups, err := collective.InprocGroups(ctx, 2, "overlap", 1, collective.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { collective.CloseGroups(groups) })
	data := newBlobs(600)
	ranks, models := make([]*Trainer, 2), make([]*linearModel, 2)
	for r, g := range groups {
		models[r] = newLinearModel()
		opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum"}, models[r].Params())
		tr, err := NewTrainer(ctx, g, models[r], data, opt, Config{GlobalBatch: 60, BucketBytes: 64, Schedule: nn.Schedule{Base: 0.05}, Seed: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.Close)
		if len(tr.grads.chunks) != 2 {
			t.Fatalf("%d gradient chunks, want 2", len(tr.grads.chunks))
		}
		ranks[r] = tr
	}
	return ranks, models
}

// TestStepOverlapsBackward: in an overlapped step the first bucket's
// allreduce completes while the backward pass is still running — each
// rank's model waits for it half-way, which would never return if buckets
// were only reduced after the backward pass.
func TestStepOverlapsBackward(t *testing.T) {
	ranks, models := overlapRanks(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for r, tr := range ranks {
		models[r].mid = func() error { return tr.fuser.WaitBucket(ctx, 0) }
	}
	errs := make(chan error, 2)
	for _, tr := range ranks {
		go func() { _, err := tr.Step(ctx); errs <- err }()
	}
	for range ranks {
		if err := testwait.Recv(t, errs, time.Minute, "a rank's step"); err != nil {
			t.Fatal(err)
		}
	}
	if !sameBits(paramsOf(ranks[0]), paramsOf(ranks[1])) {
		t.Fatal("ranks' parameters differ")
	}
}

// groupRecorder stands for the group actor: it records every message a
// rank sends it, and answers none.
type groupRecorder struct{ got chan<- any }

func (c *groupRecorder) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case actor.SystemMessage, actor.AutoReceiveMessage:
	default:
		c.got <- ctx.Message()
	}
}

// TestRankActorNoRoundTrip: bulk-synchronous rank actors, overlapped or
// not, run all their steps with no message to the group actor and no
// answer from it (a step's allreduce waits for every rank by itself), and
// end with the same parameters.
func TestRankActorNoRoundTrip(t *testing.T) {
	for _, noOverlap := range []bool{false, true} {
		t.Run(map[bool]string{false: "overlap", true: "no overlap"}[noOverlap], func(t *testing.T) {
			ranks, _ := overlapRanks(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			done := make(chan error, len(ranks))
			_, got := spawnRankActors(t, ctx, ranks, func(c *RankConfig) {
				c.NoOverlap = noOverlap
				c.OnDone = func(err error) { done <- err }
			})
			for range ranks {
				if err := testwait.Recv(t, done, time.Minute, "a rank's five steps"); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case m := <-got:
				t.Fatalf("the group actor was sent %T %v", m, m)
			default:
			}
			for r, tr := range ranks {
				if s := tr.State().Step; s != 5 {
					t.Fatalf("rank %d ended at step %d, want 5", r, s)
				}
			}
			if !sameBits(paramsOf(ranks[0]), paramsOf(ranks[1])) {
				t.Fatal("ranks' parameters differ")
			}
		})
	}
}

// TestRecoverAfterLaunch: a model failure after the step's first bucket
// was sent to be reduced cannot be repaired on this rank alone (the others
// are part-way through the step's reductions); before it, it can.
func TestRecoverAfterLaunch(t *testing.T) {
	for _, tc := range []struct {
		name     string
		launched bool
	}{{"before the first bucket", false}, {"after the first bucket", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			groups, err := collective.InprocGroups(ctx, 1, "launch", 1, collective.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer collective.CloseGroups(groups)
			m := newLinearModel()
			opt, _ := nn.NewOptimizer(nn.OptimizerConfig{}, m.Params())
			tr, err := NewTrainer(ctx, groups[0], m, newBlobs(100), opt, Config{GlobalBatch: 10, BucketBytes: 64, Schedule: nn.Schedule{Base: 0.1}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			tr.State().Commit()
			if tc.launched {
				m.mid = func() error { panic("injected failure half-way through the backward pass") }
			} else {
				m.first = func() { panic("injected failure before the backward pass") }
			}
			var pe *PanicError
			if err := tr.ComputeOverlapped(ctx); !errors.As(err, &pe) {
				t.Fatalf("compute: %v, want a panic error", err)
			}
			_, _, err = tr.Recover(ctx)
			if got := errors.Is(err, ErrUnrecoverable); got != tc.launched {
				t.Fatalf("recover: %v; unrecoverable %v, want %v", err, got, tc.launched)
			}
		})
	}
}

// TestWithdraw: a hybrid rank late in an overlapped step is taken out of it
// (Withdraw) as long as it has sent no bucket — it then reduces zeros with
// the late ranks and its gradients are dropped — and not once it has: its
// gradients are in the step's sum and it reduces as a participant. Either
// way both ranks apply the same update.
func TestWithdraw(t *testing.T) {
	for _, tc := range []struct {
		name string
		sent bool // rank 1 is withdrawn after its first bucket was sent
	}{{"before the first bucket", false}, {"after the first bucket", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ranks, models := overlapRanks(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			withdrawn := make(chan bool, 1)
			hook := func() error { withdrawn <- ranks[1].Withdraw(1); return nil }
			if tc.sent {
				models[1].mid = hook
			} else {
				models[1].first = func() { _ = hook() }
			}
			errs := make(chan error, 2)
			stats := make([]StepStats, 2)
			go func() { // rank 0: on time
				err := ranks[0].ComputeOverlapped(ctx)
				if err == nil {
					err = ranks[0].ReduceStep(ctx, 1, true)
				}
				if err == nil {
					stats[0], err = ranks[0].ApplyStep(ctx)
				}
				errs <- err
			}()
			go func() { // rank 1: the step closed without it while it computed
				err := ranks[1].ComputeOverlapped(ctx)
				var in bool
				select {
				case w := <-withdrawn:
					in = !w
				case <-ctx.Done():
					err = fmt.Errorf("rank 1's withdrawal never came: %w", ctx.Err())
				}
				if err == nil {
					err = ranks[1].ReduceStep(ctx, 1, in)
				}
				if err == nil {
					stats[1], err = ranks[1].ApplyStep(ctx)
				}
				errs <- err
			}()
			for range ranks {
				if err := testwait.Recv(t, errs, time.Minute, "a rank's hybrid step"); err != nil {
					t.Fatal(err)
				}
			}
			if stats[1].Participated != tc.sent || stats[0].Participants != map[bool]int{false: 1, true: 2}[tc.sent] {
				t.Fatalf("rank 1 participated %v, %d participants; want %v", stats[1].Participated, stats[0].Participants, tc.sent)
			}
			if !sameBits(paramsOf(ranks[0]), paramsOf(ranks[1])) {
				t.Fatal("ranks' parameters differ")
			}
		})
	}
}

// spawnRankActors starts one rank actor per trainer (generation 1, 5 steps,
// edit applied to each configuration) under a group that only records the
// messages it is sent; it returns the actor system (ended with the test)
// and those messages.
func spawnRankActors(t *testing.T, ctx context.Context, ranks []*Trainer, edit func(*RankConfig)) (*actors.System, <-chan any) {
	t.Helper()
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Shutdown)
	got := make(chan any, 64)
	group := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &groupRecorder{got: got} }))
	for r, tr := range ranks {
		c := RankConfig{Trainer: tr, Rank: r, Generation: 1, Steps: 5, Group: group, Context: ctx}
		edit(&c)
		sys.Root.Spawn(NewRankProps(c))
	}
	return sys, got
}
