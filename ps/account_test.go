package ps

import (
	"context"
	"testing"
	"time"
)

// TestClocksTook: a shard's account counts the pushes it applied and
// names the first taken out of sequence: a step taken again, or the first
// step missing below one taken (not under asp, where a step reaches only
// the shards its keys fall on). A step lost beside one taken twice leaves
// the count even; the names still tell.
func TestClocksTook(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    Mode
		restore int64
		ids     []uint64
		want    PushCounts
	}{
		{name: "in order", mode: BSP, ids: []uint64{1, 2, 3}, want: PushCounts{Applied: 3}},
		{name: "a step taken twice", mode: BSP, ids: []uint64{1, 2, 2, 3}, want: PushCounts{Applied: 4, Again: 2}},
		{name: "a step lost", mode: SSP, ids: []uint64{1, 2, 4, 5}, want: PushCounts{Applied: 4, Skipped: 3}},
		{name: "lost and twice, the count even", mode: Hybrid, ids: []uint64{1, 3, 3, 4}, want: PushCounts{Applied: 4, Again: 3, Skipped: 2}},
		{name: "the first of each kept", mode: BSP, ids: []uint64{1, 3, 3, 5, 5}, want: PushCounts{Applied: 5, Again: 3, Skipped: 2}},
		{name: "asp skips shards", mode: ASP, ids: []uint64{1, 4, 9}, want: PushCounts{Applied: 3}},
		{name: "asp twice", mode: ASP, ids: []uint64{1, 4, 4}, want: PushCounts{Applied: 3, Again: 4}},
		{name: "after a restore", mode: BSP, restore: 5, ids: []uint64{6, 7}, want: PushCounts{Applied: 2, Base: 5}},
		{name: "a restored step again", mode: BSP, restore: 5, ids: []uint64{6, 5}, want: PushCounts{Applied: 2, Base: 5, Again: 5}},
		{name: "a gap after a restore", mode: BSP, restore: 5, ids: []uint64{7}, want: PushCounts{Applied: 1, Base: 5, Skipped: 6}},
		{name: "no id, no sequence", mode: BSP, ids: []uint64{0, 0}, want: PushCounts{Applied: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClocks(SyncSpec{Mode: tc.mode, Workers: 2, Quorum: 1, Deadline: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if tc.restore > 0 {
				c.restore(tc.restore)
			}
			for _, id := range tc.ids {
				c.Took(1, id)
			}
			got := c.Counts(1)
			got.Last, got.Duplicates = 0, 0 // Push's, not Took's
			if got != tc.want {
				t.Errorf("after %v: %+v, want %+v", tc.ids, got, tc.want)
			}
			if other := c.Counts(0); other.Applied != 0 || other.Again != 0 || other.Skipped != 0 {
				t.Errorf("worker 0 took nothing: %+v", other)
			}
		})
	}
}

// TestInfoNamesSkippedStep: the account a client reads from a shard
// (OpInfo) carries the first step skipped, on every shard the push
// skipped: a worker that jumps a step (ssp takes any later clock) is
// named with the step it never pushed.
func TestInfoNamesSkippedStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newCluster(t, 1, 2, 0, []TableSpec{sgdTable(1)}, SyncSpec{Mode: SSP, Workers: 2, Staleness: 100})
	w := c.client(1, PartitionHash)
	keys := []uint64{3, 500} // one on each shard
	for range 2 {
		if _, err := w.Push(ctx, 1, keys, []float32{0.5, 0.25}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.SetClock(1, 3); err != nil { // the next push is step 4: step 3 never pushed
		t.Fatal(err)
	}
	if _, err := w.Push(ctx, 1, keys, []float32{0.5, 0.25}); err != nil {
		t.Fatal(err)
	}
	for sh := range 2 {
		info, err := w.Info(ctx, 1, sh)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := info.Pushes[1], (PushCounts{Last: 4, Applied: 3, Skipped: 3}); got != want {
			t.Errorf("shard %d's account of worker 1: %+v, want %+v", sh, got, want)
		}
		if got := info.Pushes[0]; got != (PushCounts{}) {
			t.Errorf("shard %d's account of worker 0, which pushed nothing: %+v", sh, got)
		}
	}
}
