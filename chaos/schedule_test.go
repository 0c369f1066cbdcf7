package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testclock"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// slowHold takes effect at once, then takes a while to confirm that it
// took hold, as a SIGKILL's wait for its process to be dead does on a
// loaded machine.
type slowHold struct {
	clock   *testclock.Manual
	effects chan time.Time // when it took effect
}

func (f *slowHold) Inject(context.Context, *Env) (string, error) {
	f.effects <- f.clock.Now()
	f.clock.Advance(300 * time.Millisecond)
	return "held", nil
}

func (f *slowHold) Heal(context.Context, *Env) (string, error) { return "", nil }

// TestInjectedWhenSent: a fault's injection time is when it was sent, not
// when its injection returned. The job may close ranks before the harness
// has confirmed the kill (run26: the new ring's generation event came
// before the late stamp, so invariant 0 found the killed worker "in every
// generation after" its kill and failed a job that had closed ranks).
func TestInjectedWhenSent(t *testing.T) {
	clock := testclock.New(time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC))
	hold := &slowHold{clock: clock, effects: make(chan time.Time, 1)}
	kinds := Kinds{"hold": {Name: "hold", NeedsRank: true, Changes: "ring", New: func(Planned) Fault { return hold }}}
	f := &FaultRecord{Planned: Planned{Kind: "hold", Step: 2, Rank: 1}, Changes: "ring"}
	ru := &run{r: &Runner{Now: clock.Now}, sc: &Scenario{}, kinds: kinds, faults: []*FaultRecord{f},
		damaged: map[string]bool{}, saved: map[string]uint32{}, pids: map[int64]bool{}, addrs: map[string]bool{}}
	member := func(rank int, id string) map[string]any {
		return map[string]any{"rank": float64(rank), "id": id, "pid": float64(100 + rank)}
	}
	var all []Event
	evs := make(chan Event)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ru.schedule(testwait.Context(t, time.Minute), evs, 1)
	}()
	send := func(kind string, fields map[string]any) {
		e := Event{At: clock.Now(), Kind: kind, Fields: fields}
		all = append(all, e)
		select {
		case evs <- e:
		case <-time.After(10 * time.Second):
			t.Fatalf("the scheduler did not take the %s event within 10s", kind)
		}
		clock.Advance(time.Millisecond)
	}
	send("job_started", map[string]any{})
	send("generation", map[string]any{"generation": float64(1), "members": []any{member(0, "w0"), member(1, "w1")}})
	send("step", map[string]any{"step": float64(1), "generation": float64(1)})
	send("step", map[string]any{"step": float64(2), "generation": float64(1)}) // fires the fault
	// The ring closed ranks while the harness was still confirming the
	// kill: the events are stamped when they happened.
	at := testwait.Recv(t, hold.effects, 10*time.Second, "the fault to be injected after step 2")
	for _, e := range []Event{
		{At: at.Add(20 * time.Millisecond), Kind: "generation", Fields: map[string]any{"generation": float64(2), "members": []any{member(0, "w0")}}},
		{At: at.Add(40 * time.Millisecond), Kind: "step", Fields: map[string]any{"step": float64(3), "generation": float64(2)}},
	} {
		all = append(all, e)
		evs <- e
	}
	close(evs)
	testwait.Recv(t, done, 10*time.Second, "the scheduler to end with its events")
	switch {
	case f.Injected.IsZero() || f.Error != "":
		t.Fatalf("the fault was not injected: %+v", f)
	case f.Injected.After(at):
		t.Errorf("injected at %v, %v after the fault took effect", f.Injected.Format(time.StampMilli), f.Injected.Sub(at))
	}
	if !leftRing(all, f) {
		t.Errorf("invariant 0 does not see worker %s leave the ring in generation 2, decided 20ms after the kill", f.TargetID)
	}
	if f.RecoveredAt.IsZero() || f.RecoveryS < 0.04 {
		t.Errorf("recovery %.3fs (at %v), want the 40ms from the kill to the new ring's first step", f.RecoveryS, f.RecoveredAt)
	}
}

// noted reports its injection and its heal on channels.
type noted struct{ injected, healed chan string }

func (f *noted) Inject(context.Context, *Env) (string, error) {
	f.injected <- "in"
	return "noted", nil
}
func (f *noted) Heal(context.Context, *Env) (string, error) { f.healed <- "out"; return "healed", nil }

// TestScheduleTimers: the scheduler wakes for what its timetable says is
// due in time (After the first step, a Duration's end) with no event to
// wake it, and heals what is still in when the events end.
func TestScheduleTimers(t *testing.T) {
	timed := &noted{injected: make(chan string, 1), healed: make(chan string, 1)}
	long := &noted{injected: make(chan string, 1), healed: make(chan string, 1)}
	kinds := Kinds{
		"timed": {Name: "timed", Changes: "ring", New: func(Planned) Fault { return timed }},
		"long":  {Name: "long", Changes: "ring", New: func(Planned) Fault { return long }},
	}
	fTimed := &FaultRecord{Planned: Planned{Index: 0, Kind: "timed", After: Duration(20 * time.Millisecond), Duration: Duration(20 * time.Millisecond), Rank: -1}}
	fLong := &FaultRecord{Planned: Planned{Index: 1, Kind: "long", Step: 1, Duration: Duration(time.Hour), Rank: -1}}
	ru := &run{r: &Runner{}, sc: &Scenario{}, kinds: kinds, faults: []*FaultRecord{fTimed, fLong},
		damaged: map[string]bool{}, saved: map[string]uint32{}, pids: map[int64]bool{}, addrs: map[string]bool{}}
	evs := make(chan Event, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ru.schedule(testwait.Context(t, time.Minute), evs, 1)
	}()
	evs <- Event{At: time.Now(), Kind: "job_started", Fields: map[string]any{}}
	evs <- Event{At: time.Now(), Kind: "generation", Fields: map[string]any{"generation": float64(1), "members": []any{map[string]any{"rank": float64(0), "id": "w0", "pid": float64(100)}}}}
	evs <- Event{At: time.Now(), Kind: "step", Fields: map[string]any{"step": float64(1)}}
	testwait.Recv(t, long.injected, 10*time.Second, "the step-1 fault to be injected")
	testwait.Recv(t, timed.injected, 10*time.Second, "the fault 20ms after the first step to be injected, with no event after it")
	testwait.Recv(t, timed.healed, 10*time.Second, "the fault to be healed 20ms after its injection, with no event after it")
	close(evs)
	testwait.Recv(t, done, 10*time.Second, "the scheduler to end with its events")
	select {
	case <-long.healed:
	default:
		t.Error("the fault of an hour was not healed as the events ended")
	}
	for _, f := range ru.faults {
		if f.Injected.IsZero() || f.Healed.IsZero() || f.Error != "" || f.What != "noted" || f.HealWhat != "healed" {
			t.Errorf("fault %d: %+v", f.Index, f)
		}
	}
	if d := fTimed.Healed.Sub(fTimed.Injected); d < 20*time.Millisecond {
		t.Errorf("healed %v after its injection, want its Duration of 20ms", d)
	}
}
