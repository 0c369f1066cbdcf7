package coordinator

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

func regs(ids ...string) []*phalanxpb.Registration {
	var out []*phalanxpb.Registration
	for _, id := range ids {
		out = append(out, &phalanxpb.Registration{Id: id, DataAddr: id + ":1", RankHint: -1})
	}
	return out
}

func gen(n uint64, ids ...string) *phalanxpb.Generation {
	g := &phalanxpb.Generation{Number: n}
	for _, id := range ids {
		g.Members = append(g.Members, &phalanxpb.Member{Id: id, DataAddr: id + ":1"})
	}
	return g
}

func ids(g *phalanxpb.Generation) []string {
	var out []string
	for _, m := range g.Members {
		out = append(out, m.Id)
	}
	return out
}

func TestDecide(t *testing.T) {
	r := Rendezvous{MinWorkers: 2, MaxWorkers: 4}
	hinted := regs("z", "y", "x")
	hinted[0].RankHint, hinted[1].RankHint = 0, 1
	cases := []struct {
		name    string
		cur     *phalanxpb.Generation
		live    []*phalanxpb.Registration
		admit   bool
		change  bool
		short   bool
		members []string
		number  uint64
		reason  string
		broken  bool
	}{
		{"first rendezvous sorts by id", nil, regs("c", "a", "b"), true, true, false, []string{"a", "b", "c"}, 1, "rendezvous of 3", false},
		{"first waits for a last call", nil, regs("c", "a", "b"), false, false, false, nil, 0, "join window", false},
		{"first full needs no window", nil, regs("c", "a", "b", "d"), false, true, false, []string{"a", "b", "c", "d"}, 1, "rendezvous of 4", false},
		{"rank hints first", nil, hinted, true, true, false, []string{"z", "y", "x"}, 1, "rendezvous", false},
		{"too few to start", nil, regs("a"), true, false, true, nil, 0, "fewer than the minimum", false},
		{"first admits at most max", nil, regs("a", "b", "c", "d", "e"), false, true, false, []string{"a", "b", "c", "d"}, 1, "", false},
		{"steady", gen(3, "a", "b", "c"), regs("c", "b", "a"), true, false, false, nil, 0, "", false},
		{"lost keeps ring order", gen(3, "c", "a", "b"), regs("a", "b"), false, true, false, []string{"a", "b"}, 4, "lost rank 0 (c, lease expired)", false},
		{"lost middle", gen(3, "c", "a", "b"), regs("c", "b"), false, true, false, []string{"c", "b"}, 4, "lost rank 1 (a, lease expired)", false},
		{"two lost at once", gen(5, "a", "b", "c", "d"), regs("a", "d"), false, true, false, []string{"a", "d"}, 6, "lost rank 1 (b, lease expired); lost rank 2 (c, lease expired)", false},
		{"lost below min", gen(3, "a", "b"), regs("a"), false, false, true, nil, 0, "fewer than the minimum", false},
		{"newcomer waits for the window", gen(2, "a", "b"), regs("a", "b", "n"), false, false, false, nil, 0, "", false},
		{"newcomer admitted", gen(2, "a", "b"), regs("a", "b", "n"), true, true, false, []string{"a", "b", "n"}, 3, "joined n", false},
		{"newcomer rides a loss", gen(2, "a", "b", "c"), regs("a", "c", "n"), false, true, false, []string{"a", "c", "n"}, 3, "lost rank 1 (b, lease expired); joined n", false},
		{"full: newcomer stays out", gen(2, "a", "b", "c", "d"), regs("a", "b", "c", "d", "n"), true, false, false, nil, 0, "", false},
		{"rejoin under a new id", gen(2, "a", "b", "c"), regs("a", "b", "c2"), true, true, false, []string{"a", "b", "c2"}, 3, "lost rank 2 (c, lease expired); joined c2", false},
		{"broken ring is rebuilt as it is", gen(4, "b", "a"), regs("a", "b"), false, true, false, []string{"b", "a"}, 5, "removed nobody", true},
		{"broken ring admits a waiting newcomer", gen(4, "b", "a"), regs("a", "b", "n"), false, true, false, []string{"b", "a", "n"}, 5, "joined n", true},
		{"broken first rendezvous is no rebuild", nil, regs("a", "b"), false, false, false, nil, 0, "join window", true},
		{"empty generation restarts rendezvous", gen(7), regs("b", "a"), true, true, false, []string{"a", "b"}, 8, "rendezvous", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(Input{Current: tc.cur, Live: tc.live, Rendezvous: r, Step: 17, Admit: tc.admit, Broken: tc.broken})
			if d.Change != tc.change || d.Short != tc.short {
				t.Fatalf("change %v short %v (%q), want change %v short %v", d.Change, d.Short, d.Reason, tc.change, tc.short)
			}
			if !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("reason %q, want it to contain %q", d.Reason, tc.reason)
			}
			if !tc.change {
				return
			}
			if got := ids(d.Next); !slices.Equal(got, tc.members) {
				t.Errorf("members %v, want %v", got, tc.members)
			}
			if d.Next.Number != tc.number || d.Next.StartStep != 17 {
				t.Errorf("generation %d from step %d, want %d from 17", d.Next.Number, d.Next.StartStep, tc.number)
			}
		})
	}
}

// TestDecideLost: a lost member carries its old rank, pid and how it was
// detected.
func TestDecideLost(t *testing.T) {
	cur := gen(2, "a", "b", "c")
	cur.Members[1].Pid, cur.Members[2].Pid = 41, 42
	d := Decide(Input{Current: cur, Live: regs("a"), Rendezvous: Rendezvous{MinWorkers: 1, MaxWorkers: 3},
		DetectedBy: map[string]string{"b": "connection reset reported by a"}})
	if !d.Change || len(d.Next.Lost) != 2 {
		t.Fatalf("decision %+v, want two lost", d)
	}
	b, c := d.Next.Lost[0], d.Next.Lost[1]
	if b.Id != "b" || b.Rank != 1 || b.Pid != 41 || b.DetectedBy != "connection reset reported by a" ||
		c.Id != "c" || c.Rank != 2 || c.Pid != 42 || c.DetectedBy != "lease expired" {
		t.Errorf("lost %v, %v", b, c)
	}
}

// TestDecideDeterministic: the order of the registrations does not matter.
func TestDecideDeterministic(t *testing.T) {
	r := Rendezvous{MinWorkers: 1, MaxWorkers: 8}
	a := Decide(Input{Current: gen(4, "q", "p"), Live: regs("p", "x", "q", "m"), Rendezvous: r, Admit: true})
	b := Decide(Input{Current: gen(4, "q", "p"), Live: regs("m", "q", "x", "p"), Rendezvous: r, Admit: true})
	if !slices.Equal(ids(a.Next), ids(b.Next)) || !slices.Equal(ids(a.Next), []string{"q", "p", "m", "x"}) {
		t.Errorf("%v and %v", ids(a.Next), ids(b.Next))
	}
	if (Rendezvous{MinWorkers: 3, MaxWorkers: 2}).Validate() == nil || (Rendezvous{}).Validate() == nil {
		t.Error("invalid rendezvous accepted")
	}
}

// TestDecideExcludeAndReadmit: an excluded straggler leaves the ring (with
// its lateness), waits while excluded, and comes back as a readmission; an
// exclusion that would shrink the ring below the minimum is not applied.
func TestDecideExcludeAndReadmit(t *testing.T) {
	r := Rendezvous{MinWorkers: 2, MaxWorkers: 4}
	ex := map[string]*phalanxpb.Exclusion{"c": {Id: "c", LateIn: 3, Window: 5}}
	cur := gen(4, "a", "b", "c", "d")
	d := Decide(Input{Current: cur, Live: regs("a", "b", "c", "d"), Rendezvous: r, Excluded: ex})
	if !d.Change || !slices.Equal(ids(d.Next), []string{"a", "b", "d"}) || len(d.Next.Excluded) != 1 || len(d.Next.Lost) != 0 {
		t.Fatalf("exclusion: %v excluded %v lost %v", ids(d.Next), d.Next.Excluded, d.Next.Lost)
	}
	if x := d.Next.Excluded[0]; x.Id != "c" || x.Rank != 2 || x.LateIn != 3 || x.Window != 5 || !strings.Contains(d.Reason, "excluded rank 2 (c, straggler: late in 3 of its last 5 steps)") {
		t.Fatalf("excluded %v, reason %q", x, d.Reason)
	}
	// While excluded, c is no newcomer, even with the join window passed.
	next := d.Next
	if d := Decide(Input{Current: next, Live: regs("a", "b", "c", "d"), Rendezvous: r, Excluded: ex, Admit: true}); d.Change {
		t.Fatalf("an excluded worker was admitted: %v", ids(d.Next))
	}
	// The exclusion lifted: readmitted once its join window passed.
	d = Decide(Input{Current: next, Live: regs("a", "b", "c", "d"), Rendezvous: r, Admit: true, WasExcluded: map[string]bool{"c": true}})
	if !d.Change || !slices.Equal(ids(d.Next), []string{"a", "b", "d", "c"}) || !slices.Equal(d.Next.Readmitted, []string{"c"}) ||
		!strings.Contains(d.Reason, "readmitted c") || strings.Contains(d.Reason, "joined") {
		t.Fatalf("readmission: %v readmitted %v reason %q", ids(d.Next), d.Next.Readmitted, d.Reason)
	}
	// Two members left, the minimum: an exclusion would go below it.
	small := gen(7, "a", "b")
	if d := Decide(Input{Current: small, Live: regs("a", "b"), Rendezvous: r, Excluded: map[string]*phalanxpb.Exclusion{"b": {Id: "b"}}}); d.Change {
		t.Fatalf("excluded below the minimum: %v", ids(d.Next))
	}
}

func TestFirstRingHolds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	seen := map[string]time.Time{"a": t0, "b": t0.Add(2 * time.Second)}
	for _, tc := range []struct {
		name     string
		want     int
		live     int
		seen     map[string]time.Time
		now      time.Time
		hold     bool
		wantLeft time.Duration
	}{
		{"no wait asked", 0, 2, seen, t0.Add(time.Second), false, 0},
		{"every worker live", 2, 2, seen, t0.Add(time.Second), false, 0},
		{"one missing, within the wait", 3, 2, seen, t0.Add(10 * time.Second), true, 50 * time.Second},
		{"one missing, wait over (from the earliest)", 3, 2, seen, t0.Add(61 * time.Second), false, -time.Second},
		{"nobody registered", 3, 0, map[string]time.Time{}, t0, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hold, left := firstRingHolds(tc.want, time.Minute, tc.live, tc.seen, tc.now)
			if hold != tc.hold || (tc.want > 0 && len(tc.seen) > 0 && tc.live < tc.want && left != tc.wantLeft) {
				t.Fatalf("firstRingHolds = %v, %v; want %v, %v", hold, left, tc.hold, tc.wantLeft)
			}
		})
	}
}

// TestDecideRound: the coordinator's clocks, as values. A newcomer waits
// its join window (the soonest window is the wake-up), newcomers whose
// windows overlap enter one generation, the first ring waits for the
// workers launched, and a ring below the minimum is stopped after
// MinWorkersTimeout.
func TestDecideRound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ms := time.Millisecond
	base := rules{rendezvous: Rendezvous{MinWorkers: 2, MaxWorkers: 4}, joinWindow: time.Second,
		minWorkersTimeout: time.Minute, firstRingWait: 30 * time.Second}
	ring := func(first int) rules { r := base; r.firstRing = first; return r }
	min3 := base
	min3.rendezvous.MinWorkers = 3
	stopped := &phalanxpb.Generation{Number: 5, Stopped: true, StartStep: 40, Reason: "stopped: ..."}
	started := gen(3, "a", "b")
	started.StartStep = 17
	seen := func(kv ...any) map[string]time.Time {
		m := map[string]time.Time{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1].(time.Time)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		ru   rules
		in   round
		// want
		members    []string // nil: no generation written
		number     uint64
		step       int64
		stop       bool
		reason     string
		wake       time.Time
		firstSeen  map[string]time.Time
		shortSince time.Time
	}{
		{name: "a newcomer seen for the first time waits its window", ru: base,
			in:   round{now: t0, current: gen(2, "a", "b"), live: regs("a", "b", "n")},
			wake: at(time.Second), firstSeen: seen("n", t0)},
		{name: "join window not yet over", ru: base,
			in:   round{now: at(400 * ms), current: gen(2, "a", "b"), live: regs("a", "b", "n"), clocks: clocks{firstSeen: seen("n", t0)}},
			wake: at(time.Second), firstSeen: seen("n", t0)},
		{name: "join window over: admitted", ru: base,
			in:      round{now: at(time.Second), current: gen(2, "a", "b"), live: regs("a", "b", "n"), clocks: clocks{firstSeen: seen("n", t0)}},
			members: []string{"a", "b", "n"}, number: 3, reason: "joined n", firstSeen: seen("n", t0)},
		{name: "newcomers whose windows overlap enter together", ru: base,
			in: round{now: at(time.Second), current: gen(2, "a", "b"), live: regs("a", "b", "n", "m"),
				clocks: clocks{firstSeen: seen("n", t0, "m", at(500*ms))}},
			members: []string{"a", "b", "m", "n"}, number: 3, reason: "joined m, n", firstSeen: seen("n", t0, "m", at(500*ms))},
		{name: "the soonest window wakes", ru: base,
			in: round{now: at(700 * ms), current: gen(2, "a", "b"), live: regs("a", "b", "n", "m"),
				clocks: clocks{firstSeen: seen("n", at(300*ms), "m", at(600*ms))}},
			wake: at(1300 * ms), firstSeen: seen("n", at(300*ms), "m", at(600*ms))},
		{name: "a newcomer gone is forgotten", ru: base,
			in: round{now: at(500 * ms), current: gen(2, "a", "b"), live: regs("a", "b", "n"),
				clocks: clocks{firstSeen: seen("n", t0, "gone", t0)}},
			wake: at(time.Second), firstSeen: seen("n", t0)},
		{name: "members and excluded stragglers have no window", ru: base,
			in: round{now: t0, current: gen(2, "a", "b", "x"), live: regs("a", "b", "x", "y"),
				excluded: map[string]*phalanxpb.Exclusion{"y": {Id: "y"}}},
			firstSeen: seen()},
		{name: "first rendezvous waits its window", ru: base,
			in:     round{now: t0, live: regs("c", "a", "b")},
			reason: "waiting for the join window", wake: at(time.Second), firstSeen: seen("a", t0, "b", t0, "c", t0)},
		{name: "first rendezvous once the window is over", ru: base,
			in:      round{now: at(time.Second), live: regs("c", "a", "b"), clocks: clocks{firstSeen: seen("a", t0, "b", t0, "c", t0)}},
			members: []string{"a", "b", "c"}, number: 1, reason: "rendezvous of 3 workers", firstSeen: seen("a", t0, "b", t0, "c", t0)},
		{name: "first ring waits for every worker launched", ru: ring(3),
			in:     round{now: at(5 * time.Second), live: regs("a", "b"), clocks: clocks{firstSeen: seen("a", t0, "b", at(2*time.Second))}},
			reason: "waiting for the join window", wake: at(30 * time.Second), firstSeen: seen("a", t0, "b", at(2*time.Second))},
		{name: "first ring: a newer window wakes sooner than its wait", ru: ring(3),
			in:     round{now: at(5500 * ms), live: regs("a", "b"), clocks: clocks{firstSeen: seen("a", t0)}},
			reason: "waiting for the join window", wake: at(6500 * ms), firstSeen: seen("a", t0, "b", at(5500*ms))},
		{name: "first ring complete: no wait", ru: ring(3),
			in:      round{now: at(time.Second), live: regs("a", "b", "c"), clocks: clocks{firstSeen: seen("a", t0, "b", t0, "c", t0)}},
			members: []string{"a", "b", "c"}, number: 1, reason: "rendezvous of 3 workers", firstSeen: seen("a", t0, "b", t0, "c", t0)},
		{name: "first ring wait over: who is live forms it", ru: ring(3),
			in:      round{now: at(30 * time.Second), live: regs("a", "b"), clocks: clocks{firstSeen: seen("a", t0, "b", at(2*time.Second))}},
			members: []string{"a", "b"}, number: 1, reason: "rendezvous of 2 workers", firstSeen: seen("a", t0, "b", at(2*time.Second))},
		{name: "first ring is for the first generation only", ru: ring(5),
			in:      round{now: at(time.Second), current: gen(2, "a", "b"), live: regs("a", "b", "n"), clocks: clocks{firstSeen: seen("n", t0)}},
			members: []string{"a", "b", "n"}, number: 3, reason: "joined n", firstSeen: seen("n", t0)},
		{name: "below the minimum: the clock starts", ru: base,
			in:     round{now: t0, current: started, live: regs("a")},
			reason: "1 live workers, fewer than the minimum of 2", wake: at(time.Minute), firstSeen: seen(), shortSince: t0},
		{name: "below the minimum within the timeout", ru: base,
			in:     round{now: at(59 * time.Second), current: started, live: regs("a"), clocks: clocks{shortSince: t0}},
			reason: "fewer than the minimum", wake: at(time.Minute), firstSeen: seen(), shortSince: t0},
		{name: "below the minimum for the timeout: stopped", ru: base,
			in:      round{now: at(time.Minute), current: started, live: regs("a"), clocks: clocks{shortSince: t0}},
			members: []string{}, number: 4, step: 17, stop: true,
			reason: "stopped: 1 live workers, fewer than the minimum of 2 for longer than 1m0s", firstSeen: seen()},
		{name: "back at the minimum: the clock is reset", ru: base,
			in:        round{now: at(30 * time.Second), current: started, live: regs("a", "b"), clocks: clocks{shortSince: t0}},
			firstSeen: seen()},
		{name: "below the minimum, a window ends first", ru: min3,
			in: round{now: at(10 * time.Second), current: gen(3, "a", "b", "c"), live: regs("a", "n"),
				clocks: clocks{firstSeen: seen("n", at(9500*ms)), shortSince: t0}},
			reason: "fewer than the minimum of 3", wake: at(10500 * ms), firstSeen: seen("n", at(9500*ms)), shortSince: t0},
		{name: "below the minimum, the timeout ends first", ru: min3,
			in:     round{now: at(59500 * ms), current: gen(3, "a", "b", "c"), live: regs("a", "n"), clocks: clocks{shortSince: t0}},
			reason: "fewer than the minimum of 3", wake: at(time.Minute), firstSeen: seen("n", at(59500*ms)), shortSince: t0},
		{name: "a stopped job starts over, numbered on", ru: base,
			in:      round{now: at(time.Second), current: stopped, live: regs("b", "a"), clocks: clocks{firstSeen: seen("a", t0, "b", t0)}},
			members: []string{"a", "b"}, number: 6, step: 40, reason: "rendezvous of 2 workers", firstSeen: seen("a", t0, "b", t0)},
		{name: "a stopped job below the minimum has no stop clock", ru: base,
			in:     round{now: at(2 * time.Second), current: stopped, live: regs("a"), clocks: clocks{firstSeen: seen("a", t0)}},
			reason: "fewer than the minimum", firstSeen: seen("a", t0)},
		{name: "a broken ring is rebuilt at once", ru: base,
			in:      round{now: t0, current: gen(4, "b", "a"), live: regs("a", "b"), broken: true},
			members: []string{"b", "a"}, number: 5, reason: "ring rebuilt after a failure that removed nobody", firstSeen: seen()},
		{name: "a loss says how it was detected", ru: base,
			in: round{now: t0, current: gen(4, "a", "b", "c"), live: regs("a", "b"),
				detectedBy: map[string]string{"c": "reset, probe failed"}},
			members: []string{"a", "b"}, number: 5, reason: "lost rank 2 (c, reset, probe failed)", firstSeen: seen()},
		{name: "a departure is no loss", ru: base,
			in:      round{now: t0, current: gen(4, "a", "b", "c"), live: regs("a", "b"), left: map[string]string{"c": "scale down"}},
			members: []string{"a", "b"}, number: 5, reason: "left rank 2 (c, left on request: scale down)", firstSeen: seen()},
		{name: "a straggler is excluded at once", ru: base,
			in: round{now: t0, current: gen(4, "a", "b", "c"), live: regs("a", "b", "c"),
				excluded: map[string]*phalanxpb.Exclusion{"c": {Id: "c", LateIn: 3, Window: 5}}},
			members: []string{"a", "b"}, number: 5, reason: "excluded rank 2 (c, straggler", firstSeen: seen()},
		{name: "a readmission waits its window and is named", ru: base,
			in: round{now: at(time.Second), current: gen(5, "a", "b"), live: regs("a", "b", "c"),
				wasExcluded: map[string]bool{"c": true}, clocks: clocks{firstSeen: seen("c", t0)}},
			members: []string{"a", "b", "c"}, number: 6, reason: "readmitted c", firstSeen: seen("c", t0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := decideRound(tc.ru, tc.in)
			switch {
			case tc.members == nil && v.next != nil:
				t.Fatalf("wrote generation %d %v (%q), want none", v.next.Number, ids(v.next), v.reason)
			case tc.members != nil && v.next == nil:
				t.Fatalf("no generation (%q), want %d %v", v.reason, tc.number, tc.members)
			case v.next != nil:
				if got := ids(v.next); !slices.Equal(got, tc.members) {
					t.Errorf("members %v, want %v", got, tc.members)
				}
				if v.next.Number != tc.number || v.next.StartStep != tc.step || v.next.Stopped != tc.stop || v.stop != tc.stop {
					t.Errorf("generation %d from step %d, stopped %v (stop %v); want %d from %d, stopped %v",
						v.next.Number, v.next.StartStep, v.next.Stopped, v.stop, tc.number, tc.step, tc.stop)
				}
				if tc.stop && v.next.Reason != v.reason {
					t.Errorf("stop generation's reason %q, the verdict's %q", v.next.Reason, v.reason)
				}
			}
			if !strings.Contains(v.reason, tc.reason) {
				t.Errorf("reason %q, want it to contain %q", v.reason, tc.reason)
			}
			if !v.wake.Equal(tc.wake) {
				t.Errorf("wake-up %v, want %v (zero: none)", at0(v.wake, t0), at0(tc.wake, t0))
			}
			if !maps.EqualFunc(v.clocks.firstSeen, tc.firstSeen, time.Time.Equal) {
				t.Errorf("first seen %v, want %v", v.clocks.firstSeen, tc.firstSeen)
			}
			if !v.clocks.shortSince.Equal(tc.shortSince) {
				t.Errorf("below the minimum since %v, want %v (zero: not below)", at0(v.clocks.shortSince, t0), at0(tc.shortSince, t0))
			}
		})
	}
}

// at0 shows t as an offset from t0, "none" when zero.
func at0(t, t0 time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return "t0+" + t.Sub(t0).String()
}
