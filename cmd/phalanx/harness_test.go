package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/chaos"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
)

// runScenario runs sc once with seed through the chaos harness (its undisturbed
// reference, then the faults): t fails for every invariant that failed.
// It returns the report and the events by kind, for what a test asserts
// beyond the invariants.
func runScenario(t *testing.T, sc chaos.Scenario, seed uint64) (*chaos.Report, *eventTap) {
	t.Helper()
	tap := &eventTap{run: map[string][]jobtest.Event{}, ref: map[string][]jobtest.Event{}}
	r := &chaos.Runner{Registry: examples.Registry(), Dir: t.TempDir(), Configure: tap.configure}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := r.Run(ctx, sc, seed)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Invariants {
		t.Logf("invariant %d %s: %s", v.N, v.Status, v.Evidence)
		if v.Status == "fail" {
			t.Errorf("invariant %d (%s) failed: %s", v.N, v.Name, v.Evidence)
		}
	}
	return rep, tap
}

// eventTap keeps a copy of every event of a scenario's launches by kind:
// the disturbed ones (run) and the undisturbed reference (ref).
type eventTap struct {
	mu       sync.Mutex
	run, ref map[string][]jobtest.Event
}

func (e *eventTap) configure(lc *phalanx.LaunchConfig) {
	if lc.Events == nil {
		return // not a launch: the harness reads the job's geometry
	}
	to := e.run
	if strings.HasPrefix(lc.Job, "chaos-ref-") {
		to = e.ref
	}
	lc.Events = &tappedSink{next: lc.Events, tap: e, to: to}
}

type tappedSink struct {
	next events.Sink
	tap  *eventTap
	to   map[string][]jobtest.Event
}

func (s *tappedSink) Emit(kind string, fields ...events.Field) error {
	e := jobtest.Event{"event": kind}
	for _, f := range fields {
		b, err := json.Marshal(f.Value)
		if err != nil {
			return err
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		e[f.Key] = v
	}
	s.tap.mu.Lock()
	s.to[kind] = append(s.to[kind], e)
	s.tap.mu.Unlock()
	return s.next.Emit(kind, fields...)
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
