package coordinator

import (
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
