package ring

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/testmodel"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// saveSolution writes to dir, as a job of cfg would have, a checkpoint of
// step whose parameters are the regression's exact solution (w = 1..4, b =
// 0.5): a ring that restores it trains from a loss of about 0, which a
// model trained a few steps from its zero start is far from.
func saveSolution(t *testing.T, ctx context.Context, dir string, cfg job.Config, step int64) {
	t.Helper()
	m := testmodel.NewRegression(features)
	for k := range features {
		m.W.Value[k] = float32(k + 1)
	}
	m.W.Value[features] = 0.5
	params := m.Params()
	opt, err := nn.NewOptimizer(cfg.Optimizer, params)
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	configHash, stateHash := checkpointHashes(&cfg, params, opt.Slots())
	ck, err := checkpoint.New(checkpoint.Config{Store: store, Job: cfg.Job, ConfigHash: configHash, StateHash: stateHash, Seed: cfg.Seed},
		stateTensors(params, opt.Slots()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ck.SaveAlone(ctx, checkpoint.Progress{Step: step, Offset: step * int64(cfg.Batch)}, 1); err != nil {
		t.Fatal(err)
	}
	if err := ck.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreOnAFreshRing: a fresh ring of two workers (nothing trained
// yet) whose checkpoint directory holds a checkpoint of step 30 restores it
// (restoreIfFresh) on every rank and trains steps 31..40 from it: rank 0
// reports the restore, every rank begins training at step 30, the first
// step reported is 31 at the checkpoint's (exact) parameters' loss, and
// both end at step 40 with bitwise the same parameters.
func TestRestoreOnAFreshRing(t *testing.T) {
	skipInProcessWorkersUnderRace(t)
	ctx := testwait.Context(t, inProcessLimit)
	const workers, from, steps = 2, 30, 40
	c := startCluster(t, ctx, "restore", workers, 1)
	dir := t.TempDir()
	base := c.workerConfig(0, steps)
	base.Checkpoint.Location, base.Checkpoint.Resume = dir, true
	saveSolution(t, ctx, dir, base, from)

	reps := make([]*reports, workers)
	var ends []<-chan outcome
	for i := range workers {
		cfg := c.workerConfig(i, steps)
		cfg.Checkpoint = base.Checkpoint
		reps[i] = &reports{}
		cfg.Reports = reps[i].add
		task, _ := regressionTask(cfg.Seed)
		ends = append(ends, runWorker(ctx, cfg, task))
	}
	results := finished(t, ends)
	checkSameEnd(t, results, steps, workers)
	var restored []job.Checkpoint // rank 0's: its checkpoint's restore, its ring
	var ringReports []Restored
	for i, r := range reps {
		for _, rep := range reportsOf[job.Checkpoint](r) {
			if rep.Checkpoint.Kind == "restored" {
				restored = append(restored, rep)
			}
		}
		for _, tr := range reportsOf[job.Training](r) { // every rank holds step 30's state
			if tr.Step != from || tr.Generation != 1 {
				t.Errorf("worker %d began training in generation %d at step %d, want generation 1 at step %d", i, tr.Generation, tr.Step, from)
			}
		}
		ringReports = append(ringReports, reportsOf[Restored](r)...)
	}
	if len(restored) != 1 || restored[0].Step != from || restored[0].Checkpoint.WorldAfter != workers || restored[0].Checkpoint.ConfigChanged {
		t.Errorf("restores reported %+v: want one (rank 0's), of step %d onto %d workers, same settings", restored, from, workers)
	}
	if len(ringReports) != 1 || ringReports[0].Step != from || ringReports[0].World != workers || ringReports[0].Redone != 0 {
		t.Fatalf("rank 0's ring reports %+v: want one, of a ring of %d at step %d", ringReports, workers, from)
	}
	var first *Step
	for _, r := range reps {
		if s := reportsOf[Step](r); len(s) > 0 {
			first = &s[0]
		}
	}
	if first == nil || first.Step != from+1 || first.Loss > 1e-6 {
		t.Fatalf("first step reported %+v: want step %d at the restored solution's loss (below 1e-6)", first, from+1)
	}
	if results[0].Loss > 1e-6 {
		t.Errorf("held-out loss %g after training on from the exact solution: it was not restored", results[0].Loss)
	}
}

// TestSurvivorsGoOnWhenAWorkerLeaves: of a ring of three, worker 2 is asked
// to leave (its context cancelled) while it computes step 10, and held
// there until the survivors are in their new ring; it leaves gracefully
// (job.ErrLeft, a "left" report, recorded by the coordinator as left, not
// lost). The survivors roll back to their last commit (step 9: step 10
// never completed), resynchronise in a ring of two and train on to the
// last step, ending with bitwise the same parameters.
func TestSurvivorsGoOnWhenAWorkerLeaves(t *testing.T) {
	skipInProcessWorkersUnderRace(t)
	ctx := testwait.Context(t, inProcessLimit)
	const workers, steps, leaveAt = 3, 40, 10
	c := startCluster(t, ctx, "leave", workers, 1)
	leaverCtx, askToLeave := context.WithCancel(ctx)
	defer askToLeave()
	at, open := make(chan struct{}), make(chan struct{})
	reps := make([]*reports, workers)
	survivors := make(chan job.Report, 1024) // workers 0 and 1's reports
	var ends []<-chan outcome
	for i := range workers {
		cfg := c.workerConfig(i, steps)
		reps[i] = &reports{}
		if i < 2 {
			reps[i].tell = survivors
		}
		cfg.Reports = reps[i].add
		task, m := regressionTask(cfg.Seed)
		wctx := ctx
		if i == 2 {
			// Held in step 10 until its departure is decided: the ring cannot
			// finish before it leaves, and it leaves mid-job.
			m.OnStep = holdUntil(ctx, leaveAt, at, open)
			wctx = leaverCtx
		}
		ends = append(ends, runWorker(wctx, cfg, task))
	}
	testwait.Recv(t, at, inProcessLimit, "worker 2 to reach step 10")
	askToLeave()
	leaverID := registeredID(t, reps[2])
	g2 := c.awaitGeneration(t, "a generation without worker 2", func(g *phalanxpb.Generation) bool { return len(g.Lost) > 0 })
	// Let worker 2 go once the survivors are in their new ring: step 10
	// cannot then complete in the old one with its gradient.
	for {
		rep, ok := testwait.Recv(t, survivors, inProcessLimit, "the ring of two to resume").(Restored)
		if ok && rep.Generation == g2.Number {
			break
		}
	}
	close(open)
	if len(g2.Members) != 2 || len(g2.Lost) != 1 || g2.Lost[0].Id != leaverID || !g2.Lost[0].Left {
		t.Fatalf("generation %d: members %v, lost %v; want worker 2 (%s) left, two members", g2.Number, g2.Members, g2.Lost, leaverID)
	}
	var results []*job.Result
	for i, end := range ends {
		o := testwait.Recv(t, end, inProcessLimit, fmt.Sprintf("worker %d to end", i))
		if i == 2 {
			if !errors.Is(o.err, job.ErrLeft) || o.res != nil {
				t.Fatalf("worker 2, asked to leave: %+v, %v; want job.ErrLeft", o.res, o.err)
			}
			continue
		}
		if o.err != nil {
			t.Fatalf("worker %d: %v", i, o.err)
		}
		results = append(results, o.res)
	}
	checkSameEnd(t, results, steps, workers-1)
	if left := reportsOf[job.Left](reps[2]); len(left) != 1 || left[0].ID != leaverID {
		t.Errorf("worker 2's departure reports %+v, want one", left)
	}
	var resumed []Restored
	for _, r := range reps[:2] {
		for _, rep := range reportsOf[Restored](r) {
			if rep.Generation == g2.Number {
				resumed = append(resumed, rep)
			}
		}
		for _, tr := range reportsOf[job.Training](r) {
			if tr.Generation == g2.Number && tr.Step != leaveAt-1 {
				t.Errorf("a survivor began generation %d at step %d, want the last commit, %d", g2.Number, tr.Step, leaveAt-1)
			}
		}
	}
	if len(resumed) != 1 || resumed[0].World != 2 || resumed[0].Step != leaveAt-1 || resumed[0].Redone != 0 {
		t.Fatalf("the ring of two's rank 0 reported %+v; want one resumption, at step %d (the last commit), nothing redone", resumed, leaveAt-1)
	}
}
