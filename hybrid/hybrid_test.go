package hybrid

import (
	"slices"
	"testing"
	"time"
)

const ms = time.Millisecond

func TestClose(t *testing.T) {
	p := Policy{Deadline: 100 * ms, Quorum: 0.75}
	for _, tc := range []struct {
		name     string
		ready    []time.Duration
		elapsed  time.Duration
		closed   bool
		included []bool
	}{
		{"all ready before the deadline", []time.Duration{10 * ms, 20 * ms, 30 * ms, 40 * ms}, 40 * ms, true, []bool{true, true, true, true}},
		{"waiting, deadline not passed", []time.Duration{10 * ms, NotReady, 30 * ms, 40 * ms}, 50 * ms, false, nil},
		{"deadline passed with a quorum", []time.Duration{10 * ms, NotReady, 30 * ms, 40 * ms}, 100 * ms, true, []bool{true, false, true, true}},
		{"deadline passed without a quorum", []time.Duration{10 * ms, NotReady, NotReady, 40 * ms}, 150 * ms, false, nil},
		{"a report after the moment considered does not count", []time.Duration{10 * ms, 120 * ms, 30 * ms, 40 * ms}, 100 * ms, true, []bool{true, false, true, true}},
		{"one rank", []time.Duration{NotReady}, time.Second, false, nil},
	} {
		closed, parts := p.Close(tc.ready, tc.elapsed, p.Deadline)
		if closed != tc.closed || !slices.Equal(parts, tc.included) {
			t.Errorf("%s: closed %v %v, want %v %v", tc.name, closed, parts, tc.closed, tc.included)
		}
	}
}

// TestRuleCloses: the ring's steps wait for the deadline before closing
// with a quorum; the parameter server's clocks close at the quorum, and at
// the deadline with any one push; both close when every rank is ready.
func TestRuleCloses(t *testing.T) {
	for _, tc := range []struct {
		name           string
		rule           Rule
		ready, world   int
		q              float64
		deadlinePassed bool
		closes         bool
	}{
		{"at deadline: all ready before it", CloseAtDeadline, 4, 4, 0.75, false, true},
		{"at deadline: a quorum before it waits", CloseAtDeadline, 3, 4, 0.75, false, false},
		{"at deadline: a quorum at it", CloseAtDeadline, 3, 4, 0.75, true, true},
		{"at deadline: short of a quorum at it", CloseAtDeadline, 2, 4, 0.75, true, false},
		{"at deadline: an empty world", CloseAtDeadline, 0, 0, 0.5, false, true},
		{"at quorum: all ready", CloseAtQuorum, 4, 4, 0.75, false, true},
		{"at quorum: a quorum before the deadline", CloseAtQuorum, 3, 4, 0.75, false, true},
		{"at quorum: short of it before the deadline", CloseAtQuorum, 1, 4, 0.75, false, false},
		{"at quorum: one at the deadline", CloseAtQuorum, 1, 4, 0.75, true, true},
		{"at quorum: none at the deadline", CloseAtQuorum, 0, 4, 0.75, true, false},
		{"a quorum is at least one", CloseAtQuorum, 1, 4, 0.01, false, true},
		{"quorum 1 is every rank", CloseAtQuorum, 2, 3, 1, false, false},
		{"0.6 of 5 is exactly 3", CloseAtDeadline, 3, 5, 0.6, true, true},
	} {
		if got := tc.rule.Closes(tc.ready, tc.world, tc.q, tc.deadlinePassed); got != tc.closes {
			t.Errorf("%s: Closes(%d, %d, %v, %v) = %v, want %v", tc.name, tc.ready, tc.world, tc.q, tc.deadlinePassed, got, tc.closes)
		}
	}
}

func TestNextDeadline(t *testing.T) {
	fixed := Policy{Deadline: 80 * ms, Quorum: 1}
	if d := fixed.NextDeadline([]time.Duration{10 * ms}); d != 80*ms {
		t.Errorf("fixed: %v", d)
	}
	auto := Policy{Deadline: 80 * ms, Auto: true, AutoFactor: 2, AutoWindow: 3, Quorum: 1}
	for _, tc := range []struct {
		recent []time.Duration
		want   time.Duration
	}{
		{nil, 80 * ms},
		{[]time.Duration{10 * ms}, 20 * ms},
		{[]time.Duration{500 * ms, 10 * ms, 30 * ms, 20 * ms}, 40 * ms}, // only the last 3: median 20
		{[]time.Duration{10 * ms, 30 * ms}, 40 * ms},                    // even: mean of the middle two
	} {
		if d := auto.NextDeadline(tc.recent); d != tc.want {
			t.Errorf("auto %v: %v, want %v", tc.recent, d, tc.want)
		}
	}
}

func TestStepTime(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ready   []time.Duration
		elapsed time.Duration
		want    time.Duration
	}{
		{"everyone ready: the median rank", []time.Duration{40 * ms, 10 * ms, 30 * ms, 20 * ms}, 40 * ms, 30 * ms},
		{"one slow rank does not stretch it", []time.Duration{10 * ms, 12 * ms, NotReady, 11 * ms}, 50 * ms, 12 * ms},
		{"readiness after the close is late", []time.Duration{10 * ms, 60 * ms, 11 * ms}, 50 * ms, 11 * ms},
		{"most ranks late: how long it was open", []time.Duration{10 * ms, NotReady, NotReady, NotReady}, 50 * ms, 50 * ms},
		{"a single rank", []time.Duration{7 * ms}, 7 * ms, 7 * ms},
	} {
		if got := StepTime(tc.ready, tc.elapsed); got != tc.want {
			t.Errorf("%s: StepTime(%v, %v) = %v, want %v", tc.name, tc.ready, tc.elapsed, got, tc.want)
		}
	}
}

// TestExclusionAndReadmission: a straggler late in 3 of 5 steps is excluded,
// never below the minimum, and once readmitted judged afresh.
func TestExclusionAndReadmission(t *testing.T) {
	p := Policy{Deadline: 100 * ms, Quorum: 0.5, ExcludeAfter: 3, Window: 5, ReadmitAfter: 2, MinWorkers: 2}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	h := NewHistory()
	members := []string{"a", "b", "c", "d"}
	pattern := [][]bool{ // who took part, step by step: c is late every other step, d every step from the 3rd
		{true, true, false, true},
		{true, true, true, true},
		{true, true, false, false},
		{true, true, true, false},
	}
	for i, parts := range pattern {
		if ex := p.Record(h, members, parts); len(ex) != 0 {
			t.Fatalf("step %d: excluded %v too early", i+1, ex)
		}
	}
	// Both c and d are now late in 2 of their steps; the next late step of
	// both makes 3: d (3 late) and c (3 late) — the ring of 4 may lose 2.
	ex := p.Record(h, members, []bool{true, true, false, false})
	if !slices.Equal(ex, []Straggler{{"c", 3}, {"d", 3}}) || !h.Excluded("c") || !h.Excluded("d") {
		t.Fatalf("excluded %v, want [c d]", ex)
	}
	// The ring of 2 can lose none.
	for range 5 {
		if ex := p.Record(h, []string{"a", "b"}, []bool{true, false}); len(ex) != 0 {
			t.Fatalf("excluded %v below the minimum", ex)
		}
	}
	// Readmitted, c and d are members again: judged afresh.
	p.Record(h, []string{"a", "b", "c", "d"}, []bool{true, true, true, true})
	h.Rejoined([]string{"a", "b", "c", "d"})
	if h.Excluded("c") || h.Excluded("d") {
		t.Fatal("members of a new generation still marked excluded")
	}
	for range 2 {
		p.Record(h, members, []bool{true, true, true, false})
	}
	if ex := p.Record(h, members, []bool{true, true, true, false}); !slices.Equal(ex, []Straggler{{"d", 3}}) {
		t.Fatalf("a readmitted straggler late again: excluded %v, want [d]", ex)
	}
}

// TestProbation: a probation step would have met the deadline when its
// compute plus the ring's overhead does; ReadmitAfter in a row readmit.
func TestProbation(t *testing.T) {
	pr := Probation{Deadline: 100 * ms, Overhead: 20 * ms, ReadmitAfter: 2}
	for i, c := range []time.Duration{70 * ms, 90 * ms, 80 * ms, 81 * ms, 60 * ms, 80 * ms} {
		want := i == 5 // 90 and 81 miss (with the overhead); 60 and 80 meet, in a row
		if got := pr.Observe(c); got != want {
			t.Fatalf("probation step %d (compute %v): readmit %v, want %v", i, c, got, want)
		}
	}
}

func TestOverheadAndMedian(t *testing.T) {
	ready := []time.Duration{30 * ms, 50 * ms, NotReady, 90 * ms}
	compute := []time.Duration{20 * ms, 35 * ms, 10 * ms, 10 * ms}
	if o, ok := Overhead(ready, compute, 60*ms); !ok || o != 12500*time.Microsecond { // ranks 0 and 1: 10 and 15
		t.Errorf("Overhead = %v %v, want 12.5ms", o, ok)
	}
	if _, ok := Overhead([]time.Duration{NotReady}, compute[:1], 60*ms); ok {
		t.Error("Overhead of a step nobody was ready for")
	}
	for _, tc := range []struct {
		d    []time.Duration
		want time.Duration
	}{{nil, 0}, {[]time.Duration{3, 1, 2}, 2}, {[]time.Duration{4, 1, 3, 2}, 2}} {
		if got := Median(tc.d); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}

func TestValidateAndParse(t *testing.T) {
	for _, p := range []Policy{
		{Deadline: 0, Quorum: 1},
		{Deadline: ms, Quorum: 0},
		{Deadline: ms, Quorum: 1.5},
		{Deadline: ms, Quorum: 1, ExcludeAfter: 4, Window: 3},
		{Deadline: ms, Quorum: 1, ExcludeAfter: 0, Window: 3},
		{Deadline: ms, Quorum: 1, AutoFactor: 0.5},
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("%+v validated", p)
		}
	}
	if x, w, err := ParseExcludeAfter("3/10"); err != nil || x != 3 || w != 10 {
		t.Errorf("3/10: %d %d %v", x, w, err)
	}
	for _, bad := range []string{"", "3", "0/5", "6/5", "a/b"} {
		if _, _, err := ParseExcludeAfter(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
