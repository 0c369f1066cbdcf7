//go:build phalanx_plant

package ps

import (
	"testing"

	"github.com/phalanx-rt/phalanx/internal/plant"
)

// TestPlantedPushTwiceAccount: with push-twice planted, a replay (a new
// client of the same worker resuming at step 0 pushes step 1 again) is
// applied to the row a second time, and the shard's account says so
// where it applied it: two pushes taken, step 1 again. (Counted where
// Push decides, it would read one taken, one duplicate refused: exactly
// once.)
func TestPlantedPushTwiceAccount(t *testing.T) {
	t.Setenv(plant.Env, string(plant.PushTwice))
	ctx := testContext(t)
	spec := sgdTable(1)
	c := newCluster(t, 1, 1, 0, []TableSpec{spec}, SyncSpec{Mode: ASP, Workers: 1})
	keys, grad := []uint64{3}, []float32{0.25}
	for _, w := range []*Client{c.client(0, PartitionHash), c.client(0, PartitionHash)} {
		if _, err := w.Push(ctx, 1, keys, grad); err != nil {
			t.Fatal(err)
		}
	}
	want := initial(spec, 3)[0]
	for range 2 {
		want -= spec.LR * grad[0]
	}
	if got := c.rows(0, 0, 1)[3][0]; got != want {
		t.Errorf("row 3 is %v, want %v (the gradient applied twice)", got, want)
	}
	info, err := c.client(0, PartitionHash).Info(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info.Pushes[0], (PushCounts{Last: 1, Applied: 2, Duplicates: 1, Again: 1}); got != want {
		t.Errorf("the shard's account %+v, want %+v", got, want)
	}
}

// TestPlantedLoseAckedPushAccount: with lose-acked-push planted, the
// primary acknowledges worker 1's push of step 500 without forwarding it:
// its own account is exact, its backup's names step 500 never applied.
func TestPlantedLoseAckedPushAccount(t *testing.T) {
	t.Setenv(plant.Env, string(plant.LoseAckedPush))
	ctx := testContext(t)
	c := newCluster(t, 2, 1, 1, []TableSpec{sgdTable(1)}, SyncSpec{Mode: SSP, Workers: 2, Staleness: 1000}) // ssp: every step pushes every shard, a gap is a loss
	w := c.client(1, PartitionHash)
	const steps = 501
	for range steps {
		if _, err := w.Push(ctx, 1, []uint64{3}, []float32{0.25}); err != nil {
			t.Fatal(err)
		}
	}
	info, err := w.Info(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := info.Pushes[1], (PushCounts{Last: steps, Applied: steps}); got != want {
		t.Errorf("the primary's account %+v, want %+v", got, want)
	}
	v, err := c.servers[1].inspect(ctx, 0, func(s *shard) any { return s.tables[1].clocks.Counts(1) })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := v.(PushCounts), (PushCounts{Last: steps, Applied: steps - 1, Skipped: 500}); got != want {
		t.Errorf("the backup's account %+v, want %+v", got, want)
	}
}
