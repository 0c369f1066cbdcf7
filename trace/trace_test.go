package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"
)

// TestMergeAligns: two processes whose clocks differ by five seconds,
// running the same collective operations, are merged onto one clock: each
// operation's spans on the two intersect (one rank cannot finish an
// allreduce before the other entered it), the shift found is the clocks'
// difference, a half-written last line is skipped, and each thread's
// spans are kept in their order.
func TestMergeAligns(t *testing.T) {
	dir := t.TempDir()
	base := time.Unix(1_800_000_000, 0)
	skew := 5 * time.Second
	for i, off := range []time.Duration{0, skew} {
		r, err := Create(filepath.Join(dir, []string{"worker-0", "worker-1"}[i]+".jsonl"), "")
		if err != nil {
			t.Fatal(err)
		}
		for k := range 20 {
			start := base.Add(time.Duration(k) * 10 * time.Millisecond).Add(off)
			// Rank 1 enters each operation 2 ms after rank 0; both end together.
			enter := start.Add(time.Duration(i) * 2 * time.Millisecond)
			r.Span(ThreadStep, "forward/backward", start.Add(-5*time.Millisecond), enter, Args{Step: int64(k + 1), Rank: -1})
			r.Span("collectives", "allreduce", enter, start.Add(4*time.Millisecond), Args{Seq: uint64(k + 1), Generation: 1, Rank: i, Bytes: 1024})
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "worker-1.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"name":"allreduce","thread":"collec`) // killed mid-line
	f.Close()
	parts, err := Parts(dir)
	if err != nil || len(parts) != 2 {
		t.Fatalf("Parts: %v, %v", parts, err)
	}
	var out bytes.Buffer
	shifts, err := Merge(&out, parts)
	if err != nil {
		t.Fatal(err)
	}
	// The operations bound the offset to [skew-2ms, skew+4ms]: its middle.
	if got := time.Duration(shifts["worker-1"]) * time.Microsecond; got != skew+time.Millisecond {
		t.Errorf("worker-1's shift: %v, want %v", got, skew+time.Millisecond)
	}
	var file File
	if err := json.Unmarshal(out.Bytes(), &file); err != nil {
		t.Fatal(err)
	}
	ops := map[float64][]Event{}
	n := 0
	for _, e := range file.TraceEvents {
		if e.Ph == "X" && e.Name == "allreduce" {
			seq := e.Args["seq"].(float64)
			ops[seq] = append(ops[seq], e)
			n++
		}
	}
	if n != 40 {
		t.Fatalf("%d allreduce spans merged, want 40 (the half-written line skipped)", n)
	}
	for seq, es := range ops {
		a, b := es[0], es[1]
		if a.TS > b.TS+b.Dur || b.TS > a.TS+a.Dur {
			t.Errorf("allreduce %v: the ranks' spans [%v,+%v] and [%v,+%v] do not intersect after alignment", seq, a.TS, a.Dur, b.TS, b.Dur)
		}
	}
	if err := CheckFile(out.Bytes()); err != nil {
		t.Errorf("the merged trace: %v", err)
	}
}

// TestCheckFile: the structure check refuses what a broken trace would
// hold.
func TestCheckFile(t *testing.T) {
	ok := `{"traceEvents":[{"name":"process_name","ph":"M","ts":0,"pid":0,"tid":0,"args":{"name":"w"}},` +
		`{"name":"a","ph":"X","ts":0,"dur":10,"pid":0,"tid":1},{"name":"b","ph":"X","ts":10,"dur":5,"pid":0,"tid":1},` +
		`{"name":"c","ph":"X","ts":3,"dur":5,"pid":0,"tid":2}]}`
	for _, c := range []struct {
		name, file string
		bad        bool
	}{
		{"well formed", ok, false},
		{"overlap on a thread", `{"traceEvents":[{"name":"a","ph":"X","ts":0,"dur":10,"pid":0,"tid":1},{"name":"b","ph":"X","ts":9,"dur":5,"pid":0,"tid":1}]}`, true},
		{"a span without its end", `{"traceEvents":[{"name":"a","ph":"B","ts":0,"pid":0,"tid":1}]}`, true},
		{"a negative duration", `{"traceEvents":[{"name":"a","ph":"X","ts":0,"dur":-1,"pid":0,"tid":1}]}`, true},
		{"no spans", `{"traceEvents":[]}`, true},
		{"not JSON", `{"traceEv`, true},
	} {
		if err := CheckFile([]byte(c.file)); (err != nil) != c.bad {
			t.Errorf("%s: CheckFile says %v", c.name, err)
		}
	}
}

// TestMergeOneClockShortOps: two processes on one clock whose operations
// last less than a microsecond, the first to enter alternating, are not
// shifted: written in whole microseconds, such operations seem to end
// before the other rank entered, one way and then the other, and only the
// rounding's margin keeps their bounds from contradicting each other.
func TestMergeOneClockShortOps(t *testing.T) {
	dir := t.TempDir()
	base := time.Unix(1_800_000_000, 0)
	for i := range 2 {
		r, err := Create(filepath.Join(dir, []string{"worker-0", "worker-1"}[i]+".jsonl"), "")
		if err != nil {
			t.Fatal(err)
		}
		for k := range 20 {
			at := base.Add(time.Duration(k) * 100 * time.Microsecond)
			// .9µs in for whoever enters first, 1.1µs for the other; each
			// op lasts 0.3µs.
			first := k%2 == i
			enter := at.Add(1100 * time.Nanosecond)
			if first {
				enter = at.Add(900 * time.Nanosecond)
			}
			r.Span("collectives", "allreduce", enter, enter.Add(300*time.Nanosecond), Args{Seq: uint64(k + 1), Generation: 1, Rank: i, Bytes: 16})
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	parts, err := Parts(dir)
	if err != nil {
		t.Fatal(err)
	}
	shifts, err := Merge(&bytes.Buffer{}, parts)
	if err != nil {
		t.Fatal(err)
	}
	if s := shifts["worker-1"]; s != 0 {
		t.Errorf("worker-1 shifted %dµs on the same clock, want 0", s)
	}
}

// TestSpanUsesTheWallClock: a span's ends are the times' wall-clock
// readings. time.Now reads the wall clock, then the monotonic one; a
// thread descheduled between the two gets a monotonic reading that much
// later, and a length taken from the monotonic readings would end the span
// early (an allreduce written as over before its peer entered it). Such a
// start is built here by moving a time's monotonic reading.
func TestSpanUsesTheWallClock(t *testing.T) {
	start := time.Now()
	end := start.Add(50 * time.Microsecond)
	tests := []struct {
		name     string
		lateMono time.Duration // how much later than its wall reading start's monotonic one was taken
		end      time.Time
		dur      int64
	}{
		{"read together", 0, end, 50},
		{"descheduled between the reads", 40 * time.Microsecond, end, 50},
		{"an end before the start", 0, start.Add(-time.Millisecond), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "w.jsonl")
			r, err := Create(path, "")
			if err != nil {
				t.Fatal(err)
			}
			r.Span("collectives", "allreduce", laterMonotonic(t, start, tc.lateMono), tc.end, Args{Seq: 1, Generation: 1})
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var s struct{ TS, Dur int64 }
			if err := json.Unmarshal(bytes.TrimSpace(b), &s); err != nil {
				t.Fatalf("%q: %v", b, err)
			}
			wantTS := start.UnixMicro()
			if s.TS != wantTS || s.TS+s.Dur != max(tc.end.UnixMicro(), wantTS) {
				t.Errorf("span [%d,+%d], want [%d,+%d] (the wall clock's ends)", s.TS, s.Dur, wantTS, max(tc.end.UnixMicro(), wantTS)-wantTS)
			}
		})
	}
}

// laterMonotonic is t with its monotonic reading d later and its wall
// reading unchanged: what time.Now returns when its thread is descheduled
// for d between its two clock reads. It relies on time.Time's layout (a
// wall word whose top bit says a monotonic reading is in ext), unchanged
// since Go 1.9.
func laterMonotonic(t *testing.T, tm time.Time, d time.Duration) time.Time {
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	if unsafe.Sizeof(tm) != unsafe.Sizeof(layout{}) {
		t.Fatalf("time.Time is %d bytes, not the layout this test moves the monotonic reading of", unsafe.Sizeof(tm))
	}
	p := (*layout)(unsafe.Pointer(&tm))
	if p.wall>>63 != 1 {
		t.Fatal("time.Now returned no monotonic reading")
	}
	orig := tm
	p.ext += int64(d)
	if got := tm.Sub(orig); got != d || !tm.Round(0).Equal(orig.Round(0)) {
		t.Fatalf("the moved time is %v from the original by its monotonic reading, want %v, and its wall reading is moved: time.Time's layout changed", got, d)
	}
	return tm
}
