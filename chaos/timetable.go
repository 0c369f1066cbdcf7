package chaos

import "time"

// timetable says when one launch's faults fire and heal. It is fed what the
// launch's events say (observe) and asked, at a time, what is due (due);
// like etcd's raft it has no I/O, clock or goroutines of its own: the
// scheduler (run.schedule) reads the events, carries out what it is told,
// stamps the faults' records (Injected, Healed, Error) and arms its one
// timer for the wake-up time. Its decisions are in terms of the records alone, so a fault
// fired or healed is never due again.
type timetable struct {
	faults  []*FaultRecord // the run's, in plan order
	attempt int            // the launch, for recoveries
	ps      bool           // a parameter-server job: no ring, its steps alone trigger

	launched bool      // job_started seen: "launch" triggers are due
	gen      int64     // the latest generation
	members  []Member  // its ring, by rank
	step     int64     // the latest step
	ringStep int64     // the latest step seen with a ring (or in a ps job): what step triggers wait for
	firstAt  time.Time // the first step's: what After counts from
	holding  bool      // an upload is held at the gate: "upload" triggers are due
	saved    bool      // a checkpoint_saved seen: "checkpoint" triggers wait for it
}

// action is a fault the timetable says to fire, or to heal.
type action struct {
	fault *FaultRecord
	heal  bool
}

// observe takes in one of the launch's events. A step is also the end of
// the recovery of each injected fault it is the first step after (the
// first of a new ring, or of the next launch: FaultRecord.recovers).
func (t *timetable) observe(e Event) {
	switch e.Kind {
	case "job_started":
		t.launched = true
	case "checkpoint_saved":
		t.saved = true
	case "generation":
		t.gen = e.num("generation")
		t.members = membersOfEvent(e, t.members[:0])
	case "step":
		t.step = e.num("step")
		if t.firstAt.IsZero() {
			t.firstAt = e.At
		}
		// A step trigger needs a ring to pick its target from.
		if len(t.members) > 0 || t.ps {
			t.ringStep = t.step
		}
		for _, f := range t.faults {
			// Events queued before the injection are not its recovery.
			if f.RecoveredAt.IsZero() && !f.Injected.IsZero() && f.Error == "" && e.At.After(f.Injected) && f.recovers(t.attempt, t.gen) {
				f.RecoveredAt = e.At
				f.RecoveryS = e.At.Sub(f.Injected).Seconds()
			}
		}
	}
}

// recovers says whether a step of generation gen in launch attempt ends
// the fault's recovery: the first step of a new ring (or of the next
// launch, for a fault that kills the job).
func (f *FaultRecord) recovers(attempt int, gen int64) bool {
	switch f.Changes {
	case "ring":
		return attempt > f.Attempt || gen > f.Generation
	case "resume":
		return attempt > f.Attempt
	}
	return false
}

// membersOfEvent is the ring a generation event names, appended to out.
func membersOfEvent(e Event, out []Member) []Member {
	ms, _ := e.Fields["members"].([]any)
	for _, m := range ms {
		mm, _ := m.(map[string]any)
		ev := Event{Fields: mm}
		id, _ := mm["id"].(string)
		out = append(out, Member{Rank: int(ev.num("rank")), ID: id, Pid: ev.num("pid")})
	}
	return out
}

// due is what is due at now, in plan order: each pending fault whose
// trigger has come (an "on" event, a step at or past its own, After past
// the first step) and each injected fault whose Duration has run out. wake
// is when the next time-triggered fire or heal falls due after now (zero:
// none, until the next event). A scheduler that acted on acts asks again:
// a fire starts its fault's Duration.
func (t *timetable) due(now time.Time) (acts []action, wake time.Time) {
	for _, f := range t.faults {
		if f.Error != "" {
			continue
		}
		var at time.Time
		switch {
		case f.Injected.IsZero() && t.triggered(f):
			acts = append(acts, action{fault: f})
			continue
		case f.Injected.IsZero() && t.afterFirstStep(f):
			at = t.firstAt.Add(time.Duration(f.After))
		case !f.Injected.IsZero() && f.Healed.IsZero() && f.Duration > 0:
			at = f.Injected.Add(time.Duration(f.Duration))
		default:
			continue
		}
		switch {
		case !now.Before(at):
			acts = append(acts, action{fault: f, heal: !f.Injected.IsZero()})
		case wake.IsZero() || at.Before(wake):
			wake = at
		}
	}
	return acts, wake
}

// triggered says whether a pending fault's event or step trigger has come.
func (t *timetable) triggered(f *FaultRecord) bool {
	switch {
	case f.On == "launch":
		return t.launched
	case f.On == "upload":
		return t.holding && t.step >= f.Step
	case f.On == "checkpoint":
		return t.saved && t.ringStep >= f.Step
	case f.On == "" && f.Step > 0:
		return t.ringStep >= f.Step
	}
	return false
}

// afterFirstStep says whether a fault is triggered After the first step,
// and that step has come: its time is known.
func (t *timetable) afterFirstStep(f *FaultRecord) bool {
	return f.On == "" && f.Step == 0 && !t.firstAt.IsZero()
}

// unhealed are the faults still in as the launch's events end, to heal: a
// stopped process must not outlive its run.
func (t *timetable) unhealed() []*FaultRecord {
	var out []*FaultRecord
	for _, f := range t.faults {
		if !f.Injected.IsZero() && f.Healed.IsZero() && f.fault != nil {
			out = append(out, f)
		}
	}
	return out
}

// targetRank is the rank a fault fired now aims at in ring: its planned
// rank, or for a random target its pick among the ring's ranks.
func targetRank(f *FaultRecord, ring []Member) int {
	if f.RandomRank && len(ring) > 0 {
		return int(f.Pick % uint64(len(ring)))
	}
	return f.Rank
}
