package ring

import (
	"slices"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/failure"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// TestStragglerProbation: in hybrid mode (a fixed 1 s step deadline,
// a quorum of two of three), worker 2 is made to pause 3 s in each of
// steps 3..12 (Faults.Inject, whatever its rank). It is late, and the ring
// excludes it through the coordinator (late in 2 of its last 3 steps). On
// probation it is fed the ring's parameters ("fed", from rank 0) and times
// its own steps against the ring's pace; once three in a row would have
// met the deadline it is readmitted. The three end the job together with
// bitwise the same parameters.
//
// The ring's two others are held from their 300th training call until the
// readmission is decided: the job cannot end first, whatever the machine's
// pace. The feed is served before that (the ring runs some 290 steps
// after the exclusion).
func TestStragglerProbation(t *testing.T) {
	skipInProcessWorkersUnderRace(t)
	if testing.Short() {
		t.Skip("pauses of 3 s are the fault injected: a job of several seconds")
	}
	ctx := testwait.Context(t, inProcessLimit)
	const workers, holdAt, steps = 3, 300, 340
	c := startCluster(t, ctx, "straggler", workers, 1)
	open := make(chan struct{})
	reps := make([]*reports, workers)
	var ends []<-chan outcome
	for i := range workers {
		cfg := c.workerConfig(i, steps)
		cfg.Sync.Mode, cfg.Sync.Deadline, cfg.Sync.Quorum = "hybrid", time.Second, 0.6
		cfg.Sync.ExcludeAfter, cfg.Sync.ExcludeWindow, cfg.Sync.ReadmitAfter = 2, 3, 3
		reps[i] = &reports{}
		cfg.Reports = reps[i].add
		task, m := regressionTask(cfg.Seed)
		if i == 2 {
			for rank := range workers {
				for step := int64(3); step <= 12; step++ {
					cfg.Faults.Inject.Pause = append(cfg.Faults.Inject.Pause, failure.Pause{Rank: rank, At: step, For: 3 * time.Second})
				}
			}
		} else {
			m.OnStep = holdUntil(ctx, holdAt, nil, open)
		}
		ends = append(ends, runWorker(ctx, cfg, task))
	}
	testwait.Recv(t, reps[2].registered(), inProcessLimit, "worker 2 to register")
	slow := registeredID(t, reps[2])
	excluded := c.awaitGeneration(t, "worker 2 excluded", func(g *phalanxpb.Generation) bool { return len(g.Excluded) > 0 })
	readmitted := c.awaitGeneration(t, "worker 2 readmitted", func(g *phalanxpb.Generation) bool { return len(g.Readmitted) > 0 })
	close(open)
	results := finished(t, ends)
	if x := excluded.Excluded; len(x) != 1 || x[0].Id != slow || x[0].LateIn < 2 || x[0].Window != 3 || len(excluded.Members) != 2 {
		t.Fatalf("generation %d excluded %v (members %v): want worker 2 (%s) alone, late in at least 2 of 3", excluded.Number, x, excluded.Members, slow)
	}
	if !slices.Equal(readmitted.Readmitted, []string{slow}) || len(readmitted.Members) != 3 {
		t.Fatalf("generation %d readmitted %v (members %v): want worker 2 (%s) back in a ring of three", readmitted.Number, readmitted.Readmitted, readmitted.Members, slow)
	}
	for _, g := range c.generations() {
		for _, x := range g.Excluded {
			if x.Id != slow {
				t.Errorf("generation %d excluded %s: only worker 2 (%s) is slow", g.Number, x.Id, slow)
			}
		}
	}
	fed := reportsOf[Fed](reps[2])
	if len(fed) == 0 || fed[0].ID != slow || fed[0].Step < 1 {
		t.Fatalf("worker 2's feed reports %+v: on probation it should receive the ring's parameters", fed)
	}
	checkSameEnd(t, results, steps, workers)
	t.Logf("excluded in generation %d (late in %d of %d at step %d), fed %d times (first at step %d), readmitted in generation %d",
		excluded.Number, excluded.Excluded[0].LateIn, excluded.Excluded[0].Window, excluded.Excluded[0].Step, len(fed), fed[0].Step, readmitted.Number)
}
