package chaos

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestScheduleTimetable: the timetable fires each trigger when it comes
// and not before, heals a fault when its Duration has run out, and wakes
// the scheduler at the next time-triggered fire or heal. Times are values:
// no clock, timer, process or socket.
func TestScheduleTimetable(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ring := func(gen, n int) Event {
		var ms []any
		for r := range n {
			ms = append(ms, map[string]any{"rank": float64(r), "id": fmt.Sprintf("w%d", r), "pid": float64(100 + r)})
		}
		return Event{At: t0, Kind: "generation", Fields: map[string]any{"generation": float64(gen), "members": ms}}
	}
	step := func(n int64, d time.Duration) Event {
		return Event{At: at(d), Kind: "step", Fields: map[string]any{"step": float64(n)}}
	}
	started := Event{At: t0, Kind: "job_started", Fields: map[string]any{}}
	byStep := func(n int64) *FaultRecord { return &FaultRecord{Planned: Planned{Kind: "sigkill", Step: n, Rank: 1}} }
	after := func(d time.Duration) *FaultRecord {
		return &FaultRecord{Planned: Planned{Kind: "sigkill", After: Duration(d), Rank: 1}}
	}
	on := func(event string, n int64) *FaultRecord {
		return &FaultRecord{Planned: Planned{Kind: "sigkill", On: event, Step: n, Rank: -1}}
	}
	in := func(f *FaultRecord, injected time.Duration, lasts time.Duration) *FaultRecord {
		f.Injected, f.Duration = at(injected), Duration(lasts)
		return f
	}
	for _, tc := range []struct {
		name    string
		faults  []*FaultRecord
		ps      bool
		holding bool
		events  []Event
		now     time.Duration // after t0
		want    []string      // "fire N" or "heal N", N the fault's place
		wake    time.Duration // after t0; 0: none
	}{
		{name: "a checkpoint trigger at its step, no checkpoint yet", faults: []*FaultRecord{on("checkpoint", 5)},
			events: []Event{ring(1, 3), step(6, time.Second)}, now: time.Second},
		{name: "a checkpoint trigger once a checkpoint is saved", faults: []*FaultRecord{on("checkpoint", 5)},
			events: []Event{ring(1, 3), step(6, time.Second), {At: at(time.Second), Kind: "checkpoint_saved", Fields: map[string]any{}}, step(7, 2*time.Second)},
			now:    2 * time.Second, want: []string{"fire 0"}},
		{name: "a checkpoint trigger after a checkpoint, before its step", faults: []*FaultRecord{on("checkpoint", 9)},
			events: []Event{ring(1, 3), {At: at(time.Second), Kind: "checkpoint_saved", Fields: map[string]any{}}, step(7, 2*time.Second)},
			now:    2 * time.Second},
		{name: "a step trigger before its step", faults: []*FaultRecord{byStep(5)},
			events: []Event{ring(1, 3), step(4, time.Second)}, now: time.Second},
		{name: "a step trigger at its step", faults: []*FaultRecord{byStep(5)},
			events: []Event{ring(1, 3), step(4, time.Second), step(5, 2*time.Second)}, now: 2 * time.Second, want: []string{"fire 0"}},
		{name: "a step trigger past its step (events late)", faults: []*FaultRecord{byStep(5)},
			events: []Event{ring(1, 3), step(9, time.Second)}, now: time.Second, want: []string{"fire 0"}},
		{name: "a step trigger with no ring to aim at", faults: []*FaultRecord{byStep(5)},
			events: []Event{step(5, time.Second)}, now: time.Second},
		{name: "a ring after the step: the next step fires", faults: []*FaultRecord{byStep(5)},
			events: []Event{step(5, time.Second), ring(1, 3)}, now: time.Second},
		{name: "the next step with a ring fires", faults: []*FaultRecord{byStep(5)},
			events: []Event{step(5, time.Second), ring(1, 3), step(6, 2*time.Second)}, now: 2 * time.Second, want: []string{"fire 0"}},
		{name: "a parameter-server job's steps alone trigger", faults: []*FaultRecord{byStep(5)}, ps: true,
			events: []Event{step(5, time.Second)}, now: time.Second, want: []string{"fire 0"}},
		{name: "on launch before the job started", faults: []*FaultRecord{on("launch", 0)}},
		{name: "on launch", faults: []*FaultRecord{on("launch", 0)}, events: []Event{started}, want: []string{"fire 0"}},
		{name: "on upload with no upload held", faults: []*FaultRecord{on("upload", 3)},
			events: []Event{ring(1, 3), step(5, time.Second)}, now: time.Second},
		{name: "on upload, held before its step", faults: []*FaultRecord{on("upload", 6)}, holding: true,
			events: []Event{ring(1, 3), step(5, time.Second)}, now: time.Second},
		{name: "on upload, held at its step", faults: []*FaultRecord{on("upload", 5)}, holding: true,
			events: []Event{ring(1, 3), step(5, time.Second)}, now: time.Second, want: []string{"fire 0"}},
		{name: "on upload, held, no ring needed", faults: []*FaultRecord{on("upload", 0)}, holding: true,
			events: []Event{step(1, time.Second)}, now: time.Second, want: []string{"fire 0"}},
		{name: "after, before the first step: no time yet", faults: []*FaultRecord{after(3 * time.Second)},
			events: []Event{ring(1, 3)}, now: time.Hour},
		{name: "after, not yet", faults: []*FaultRecord{after(3 * time.Second)},
			events: []Event{ring(1, 3), step(1, time.Second), step(2, 2*time.Second)}, now: 2 * time.Second, wake: 4 * time.Second},
		{name: "after, due", faults: []*FaultRecord{after(3 * time.Second)},
			events: []Event{ring(1, 3), step(1, time.Second), step(2, 2*time.Second)}, now: 4 * time.Second, want: []string{"fire 0"}},
		{name: "after counts from the first step", faults: []*FaultRecord{after(3 * time.Second)},
			events: []Event{step(1, time.Second), step(9, 9*time.Second)}, now: 3 * time.Second, wake: 4 * time.Second},
		{name: "a duration not run out", faults: []*FaultRecord{in(byStep(5), 10*time.Second, 2*time.Second)},
			events: []Event{ring(1, 3), step(5, 9*time.Second)}, now: 11 * time.Second, wake: 12 * time.Second},
		{name: "a duration run out", faults: []*FaultRecord{in(byStep(5), 10*time.Second, 2*time.Second)},
			events: []Event{ring(1, 3), step(5, 9*time.Second)}, now: 12 * time.Second, want: []string{"heal 0"}},
		{name: "no duration: no heal", faults: []*FaultRecord{in(byStep(5), 10*time.Second, 0)},
			events: []Event{ring(1, 3), step(5, 9*time.Second)}, now: time.Hour},
		{name: "healed: nothing more", faults: []*FaultRecord{func() *FaultRecord {
			f := in(byStep(5), 10*time.Second, 2*time.Second)
			f.Healed = at(12 * time.Second)
			return f
		}()}, events: []Event{ring(1, 3), step(5, 9*time.Second)}, now: time.Hour},
		{name: "failed to inject: never healed", faults: []*FaultRecord{func() *FaultRecord {
			f := in(byStep(5), 10*time.Second, 2*time.Second)
			f.Error = "no such process"
			return f
		}()}, events: []Event{ring(1, 3), step(5, 9*time.Second)}, now: time.Hour},
		{name: "failed before its trigger: never fired", faults: []*FaultRecord{func() *FaultRecord {
			f := byStep(5)
			f.Error = "bad"
			return f
		}()}, events: []Event{ring(1, 3), step(5, 9*time.Second)}, now: 9 * time.Second},
		{name: "in plan order, the earliest wake",
			faults: []*FaultRecord{after(20 * time.Second), in(byStep(2), 3*time.Second, 30*time.Second), byStep(5),
				in(byStep(3), 4*time.Second, time.Second), after(7 * time.Second), byStep(9)},
			events: []Event{ring(1, 3), step(1, time.Second), step(5, 5*time.Second)}, now: 5 * time.Second,
			want: []string{"fire 2", "heal 3"}, wake: 8 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tt := &timetable{faults: tc.faults, attempt: 1, ps: tc.ps}
			for _, e := range tc.events {
				tt.observe(e)
			}
			tt.holding = tc.holding
			acts, wake := tt.due(at(tc.now))
			var got []string
			for _, a := range acts {
				verb := "fire"
				if a.heal {
					verb = "heal"
				}
				got = append(got, fmt.Sprintf("%s %d", verb, slices.Index(tc.faults, a.fault)))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("due at t0+%v: %q, want %q", tc.now, got, tc.want)
			}
			var want time.Time
			if tc.wake != 0 {
				want = at(tc.wake)
			}
			if !wake.Equal(want) {
				t.Errorf("wake at %v, want %v", wake, want)
			}
		})
	}
}

// TestScheduleTimetableRecovery: a fault's recovery ends at the first step
// after its injection of a new ring (or, for a fault that kills the job,
// of the next launch); steps queued before the injection are not it.
func TestScheduleTimetableRecovery(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)
	gen := func(g int64, at time.Duration) Event {
		return Event{At: t0.Add(at), Kind: "generation", Fields: map[string]any{"generation": float64(g)}}
	}
	step := func(n int64, at time.Duration) Event {
		return Event{At: t0.Add(at), Kind: "step", Fields: map[string]any{"step": float64(n)}}
	}
	for _, tc := range []struct {
		name    string
		changes string
		attempt int           // the launch the timetable is of (the fault was injected in 1)
		events  []Event       // the fault was injected at t0+10s in generation 1
		want    time.Duration // after t0; 0: not recovered
	}{
		{"a ring fault, the old ring's steps", "ring", 1, []Event{gen(1, 0), step(6, 11*time.Second)}, 0},
		{"a ring fault, a step queued before it", "ring", 1, []Event{gen(2, 0), step(6, 9*time.Second)}, 0},
		{"a ring fault, the new ring's first step", "ring", 1,
			[]Event{gen(2, 11*time.Second), step(6, 12*time.Second), step(7, 13*time.Second)}, 12 * time.Second},
		{"a ring fault, the next launch", "ring", 2, []Event{gen(1, 20*time.Second), step(6, 21*time.Second)}, 21 * time.Second},
		{"a job fault, a new ring", "resume", 1, []Event{gen(2, 11*time.Second), step(6, 12*time.Second)}, 0},
		{"a job fault, the next launch", "resume", 2, []Event{gen(1, 20*time.Second), step(6, 21*time.Second)}, 21 * time.Second},
		{"a fault that changes nothing", "", 2, []Event{gen(3, 20*time.Second), step(6, 21*time.Second)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &FaultRecord{Changes: tc.changes, Attempt: 1, Generation: 1, Injected: t0.Add(10 * time.Second)}
			tt := &timetable{faults: []*FaultRecord{f}, attempt: tc.attempt}
			for _, e := range tc.events {
				tt.observe(e)
			}
			var want time.Time
			wantS := 0.0
			if tc.want != 0 {
				want, wantS = t0.Add(tc.want), (tc.want - 10*time.Second).Seconds()
			}
			if !f.RecoveredAt.Equal(want) || f.RecoveryS != wantS {
				t.Errorf("recovered at %v after %.1fs, want %v", f.RecoveredAt, f.RecoveryS, want)
			}
		})
	}
}

// TestScheduleTargetRank: a random target is its pick among the ring's
// ranks at the trigger; a planned rank stays; with no ring known a random
// target is none.
func TestScheduleTargetRank(t *testing.T) {
	ring := []Member{{Rank: 0}, {Rank: 1}, {Rank: 2}}
	for _, tc := range []struct {
		p    Planned
		ring []Member
		want int
	}{
		{Planned{Rank: 2}, ring, 2},
		{Planned{Rank: -1, RandomRank: true, Pick: 7}, ring, 1},
		{Planned{Rank: -1, RandomRank: true, Pick: 7}, ring[:2], 1},
		{Planned{Rank: -1, RandomRank: true, Pick: 8}, ring[:2], 0},
		{Planned{Rank: -1, RandomRank: true, Pick: 8}, nil, -1},
	} {
		if got := targetRank(&FaultRecord{Planned: tc.p}, tc.ring); got != tc.want {
			t.Errorf("%+v in a ring of %d: rank %d, want %d", tc.p, len(tc.ring), got, tc.want)
		}
	}
}

// TestScheduleTimetableUnhealed: as the events end, every fault sent and
// not healed is to heal, a failed injection's included (its process may
// be stopped); one never sent is not.
func TestScheduleTimetableUnhealed(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)
	sent := func(healed bool, err string) *FaultRecord {
		f := &FaultRecord{Injected: t0, Error: err, fault: &slowHold{}}
		if healed {
			f.Healed = t0.Add(time.Second)
		}
		return f
	}
	faults := []*FaultRecord{sent(false, ""), sent(true, ""), sent(false, "no such process"), {}, {Injected: t0, Error: "no uploader"}}
	got := (&timetable{faults: faults}).unhealed()
	if want := []*FaultRecord{faults[0], faults[2]}; !slices.Equal(got, want) {
		t.Errorf("to heal at the end: %d faults %v, want faults 0 and 2", len(got), got)
	}
}
