package main

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/chaos"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
)

// runScenario runs sc once with seed through the chaos harness (its undisturbed
// reference, then the faults): t fails for every invariant that failed.
// It returns the report and the events by kind, for what a test asserts
// beyond the invariants.
func runScenario(t *testing.T, sc chaos.Scenario, seed uint64) (*chaos.Report, *eventTap) {
	t.Helper()
	r := &chaos.Runner{Registry: examples.Registry(), Dir: t.TempDir()}
	const limit = 5 * time.Minute // its undisturbed reference and the run
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	rep, err := r.Run(ctx, sc, seed)
	if ctx.Err() != nil {
		t.Fatalf("waited %v for scenario %s (seed %d): %v", limit, sc.Name, seed, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Invariants {
		t.Logf("invariant %d %s: %s", v.N, v.Status, v.Evidence)
		if v.Status == "fail" {
			t.Errorf("invariant %d (%s) failed: %s", v.N, v.Name, v.Evidence)
		}
	}
	return rep, &eventTap{run: byKind(rep.Events), ref: byKind(rep.RefEvents)}
}

// eventTap holds the events of a scenario's launches by kind: the
// disturbed ones (run) and the undisturbed reference (ref).
type eventTap struct {
	run, ref map[string][]jobtest.Event
}

func byKind(evs []chaos.Event) map[string][]jobtest.Event {
	out := map[string][]jobtest.Event{}
	for _, e := range evs {
		j := jobtest.Event{"event": e.Kind}
		for k, v := range e.Fields {
			j[k] = v
		}
		out[e.Kind] = append(out[e.Kind], j)
	}
	return out
}

// faultPid is the pid a signal fault's evidence names ("SIGKILL to rank 2
// (pid 1234)").
func faultPid(t *testing.T, f *chaos.FaultRecord) int {
	t.Helper()
	m := regexp.MustCompile(`\(pid (\d+)`).FindStringSubmatch(f.What)
	if m == nil {
		t.Fatalf("fault %d (%s): no pid in its evidence %q", f.Index, f.Kind, f.What)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}
