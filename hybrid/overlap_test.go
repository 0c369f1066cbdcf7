package hybrid

import (
	"testing"
	"time"
)

// TestOverlapDecisions: a step is overlapped after OverlapAfter steps in a
// row with every rank well inside the deadline; an overlapped step with a
// rank past the deadline is a fallback and doubles the on-time steps the
// next overlap needs; a generation's first step neither breaks nor starts
// a streak; NoOverlap never overlaps.
func TestOverlapDecisions(t *testing.T) {
	const d = 100 * time.Millisecond
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
			if x < 0 {
				out[i] = NotReady
			}
		}
		return out
	}
	fast, tight, late := ms(10, 20, 30), ms(10, 20, 90), ms(10, 20, -1)
	type step struct {
		ready          []time.Duration
		elapsed        int // ms
		first          bool
		next, fallback bool
	}
	for _, tc := range []struct {
		name   string
		policy Policy
		steps  []step
	}{
		{"after three on-time steps", Policy{OverlapAfter: 3}, []step{
			{fast, 30, true, false, false},
			{fast, 30, false, false, false},
			{fast, 30, false, false, false},
			{fast, 30, false, true, false},
			{fast, 30, false, true, false},
		}},
		{"a step close to the deadline breaks the streak", Policy{OverlapAfter: 2}, []step{
			{fast, 30, false, false, false},
			{tight, 90, false, false, false},
			{fast, 30, false, false, false},
			{fast, 30, false, true, false},
		}},
		{"a late rank in an overlapped step falls back and backs off", Policy{OverlapAfter: 1}, []step{
			{fast, 30, false, true, false},
			{late, 100, false, false, true}, // overlapped: fallback, the next overlap needs 2
			{fast, 30, false, false, false},
			{fast, 30, false, true, false},
			{ms(10, 20, 150), 150, false, false, true}, // waited for past the deadline: needs 4
			{fast, 30, false, false, false},
			{fast, 30, false, false, false},
			{fast, 30, false, false, false},
			{fast, 30, false, true, false},
		}},
		{"never with NoOverlap", Policy{OverlapAfter: 1, NoOverlap: true}, []step{
			{fast, 30, false, false, false},
			{fast, 30, false, false, false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o Overlap
			overlapped := false
			for i, s := range tc.steps {
				next, fb := tc.policy.Closed(&o, overlapped, s.ready, d, time.Duration(s.elapsed)*time.Millisecond, s.first)
				if next != s.next || fb != s.fallback {
					t.Fatalf("step %d (overlapped %v): next %v fallback %v, want %v %v", i+1, overlapped, next, fb, s.next, s.fallback)
				}
				overlapped = next
			}
		})
	}
}

// TestOverlapBackoffHalves: after a fallback the requirement doubles, and
// as many overlapped steps on time halve it again.
func TestOverlapBackoffHalves(t *testing.T) {
	p := Policy{OverlapAfter: 2}
	var o Overlap
	fast := []time.Duration{time.Millisecond, 2 * time.Millisecond}
	late := []time.Duration{time.Millisecond, NotReady}
	ov := false
	for range 2 {
		ov, _ = p.Closed(&o, ov, fast, time.Second, 2*time.Millisecond, false)
	}
	if !ov {
		t.Fatal("not overlapped after 2 on-time steps")
	}
	if ov, _ = p.Closed(&o, ov, late, time.Second, time.Second, false); ov || o.Need() != 4 {
		t.Fatalf("after a fallback: overlapped %v, need %d, want false and 4", ov, o.Need())
	}
	for range 4 {
		ov, _ = p.Closed(&o, ov, fast, time.Second, 2*time.Millisecond, false)
	}
	if !ov || o.Need() != 4 {
		t.Fatalf("after 4 on-time steps: overlapped %v, need %d", ov, o.Need())
	}
	for range 4 {
		ov, _ = p.Closed(&o, ov, fast, time.Second, 2*time.Millisecond, false)
	}
	if !ov || o.Need() != 2 {
		t.Fatalf("after 4 overlapped steps on time: overlapped %v, need %d, want true and 2", ov, o.Need())
	}
}
