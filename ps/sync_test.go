package ps

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

type pushStep struct {
	worker int
	id     uint64
	clock  int64
	want   PushAction
	err    string // a substring of the error wanted
}

func TestClocksPush(t *testing.T) {
	cases := []struct {
		name  string
		spec  SyncSpec
		steps []pushStep
	}{
		{"bsp", SyncSpec{Mode: BSP, Workers: 2}, []pushStep{
			{0, 1, 0, Aggregate, ""},
			{0, 2, 0, 0, "twice"},
			{0, 1, 0, Duplicate, ""},
			{1, 1, 1, 0, "while clock 0 is open"},
			{2, 1, 0, 0, "worker 2 of 2"},
			{1, 1, 0, Aggregate, ""},
		}},
		{"hybrid drop", SyncSpec{Mode: Hybrid, Workers: 3, Quorum: 0.6, Deadline: time.Second}, []pushStep{
			{0, 1, 0, Aggregate, ""},
			{1, 1, 0, Aggregate, ""},
		}},
		{"asp", SyncSpec{Mode: ASP, Workers: 2}, []pushStep{
			{0, 1, 0, ApplyNow, ""},
			{0, 2, 5, ApplyNow, ""},
			{0, 3, 4, 0, "after clock 5"},
			{1, 1, 0, ApplyNow, ""},
		}},
	}
	for _, tc := range cases {
		c, err := NewClocks(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range tc.steps {
			act, err := c.Push(s.worker, s.id, s.clock)
			if s.err != "" {
				if err == nil || !strings.Contains(err.Error(), s.err) {
					t.Errorf("%s step %d: %v, want an error about %q", tc.name, i, err, s.err)
				}
				continue
			}
			if err != nil || act != s.want {
				t.Errorf("%s step %d: %v %v, want %v", tc.name, i, act, err, s.want)
			}
		}
	}
}

// TestClocksBSPAndHybrid: a bsp clock closes when every worker pushed it and
// pulls of the next clock wait until then; a hybrid clock closes at the
// quorum or at the deadline, and a push for a closed clock is stale.
func TestClocksBSPAndHybrid(t *testing.T) {
	b, _ := NewClocks(SyncSpec{Mode: BSP, Workers: 3})
	b.Push(0, 0, 0)
	b.Push(1, 0, 0)
	if b.ShouldClose(true) || b.CanPull(1) || !b.CanPull(0) {
		t.Fatal("bsp: closed, or served the next clock, before every worker pushed")
	}
	b.Push(2, 0, 0)
	if !b.ShouldClose(false) || b.Close() != 3 || !b.CanPull(1) || b.Clock() != 1 {
		t.Fatal("bsp: clock 0 did not close with every push")
	}
	h, _ := NewClocks(SyncSpec{Mode: Hybrid, Workers: 4, Quorum: 0.75, Deadline: time.Second})
	if h.ShouldClose(true) {
		t.Fatal("hybrid: an empty clock closed at its deadline")
	}
	h.Push(0, 0, 0)
	if h.ShouldClose(false) || !h.ShouldClose(true) {
		t.Fatal("hybrid: one push should close only at the deadline")
	}
	h.Push(1, 0, 0)
	h.Push(2, 0, 0)
	if !h.ShouldClose(false) || h.Close() != 3 {
		t.Fatal("hybrid: 3 of 4 is the quorum")
	}
	if act, err := h.Push(3, 0, 0); err != nil || act != StaleDrop {
		t.Fatalf("hybrid: a push for a closed clock: %v %v, want StaleDrop", act, err)
	}
	d, _ := NewClocks(SyncSpec{Mode: Hybrid, Workers: 2, Quorum: 1, Deadline: time.Second, Decay: 0.5})
	d.Push(0, 0, 0)
	d.Close()
	if act, _ := d.Push(1, 0, 0); act != StaleDecay {
		t.Fatalf("hybrid with decay: %v, want StaleDecay", act)
	}
}

// TestClocksSSPBound drives 4 workers at random speeds under ssp with
// staleness 2: every pull served has the worker at most 2 clocks ahead of
// the slowest (checked on the recorded clocks), a worker is blocked only
// when it would exceed the bound, and every worker finishes.
func TestClocksSSPBound(t *testing.T) {
	const workers, s, clocks = 4, 2, 200
	c, err := NewClocks(SyncSpec{Mode: SSP, Workers: workers, Staleness: s})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	at := make([]int64, workers) // each worker's clock: it pulls at it, then pushes it
	ahead := make([]int64, 0, workers*clocks)
	blocked := 0
	for steps := 0; ; steps++ {
		done := 0
		w := rng.IntN(workers)
		if rng.IntN(10) < 3 {
			w = 0 // worker 0 is twice as likely to move: it runs ahead
		}
		for _, a := range at {
			if a == clocks {
				done++
			}
		}
		if done == workers {
			break
		}
		if steps > 100*workers*clocks {
			t.Fatalf("no progress: clocks %v", at)
		}
		if at[w] == clocks {
			continue
		}
		if !c.CanPull(at[w]) {
			blocked++
			if at[w]-c.Slowest() <= s {
				t.Fatalf("worker %d at clock %d blocked with the slowest at %d (bound %d)", w, at[w], c.Slowest(), s)
			}
			continue
		}
		ahead = append(ahead, at[w]-c.Slowest())
		if _, err := c.Push(w, 0, at[w]); err != nil {
			t.Fatal(err)
		}
		at[w]++
	}
	for i, a := range ahead {
		if a > s {
			t.Fatalf("pull %d served %d clocks ahead of the slowest, bound %d", i, a, s)
		}
	}
	if blocked == 0 {
		t.Error("no pull was ever blocked: the test did not exercise the bound")
	}
}

func TestSyncSpecValidate(t *testing.T) {
	for _, s := range []SyncSpec{
		{Mode: 0, Workers: 1},
		{Mode: BSP, Workers: 0},
		{Mode: SSP, Workers: 1, Staleness: -1},
		{Mode: Hybrid, Workers: 2, Quorum: 0, Deadline: time.Second},
		{Mode: Hybrid, Workers: 2, Quorum: 1},
		{Mode: Hybrid, Workers: 2, Quorum: 1, Deadline: time.Second, Decay: 2},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v validated", s)
		}
	}
	for _, m := range []string{"bsp", "asp", "ssp", "hybrid", "async"} {
		if _, err := ParseMode(m); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseMode("sync"); err == nil {
		t.Error("sync parsed")
	}
}
