package ps

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
)

// halfDirectory is a directory whose shard dead is unreachable: a push's
// sub-request to it fails and the client waits for the map to change,
// which it signals on reached (every other shard has answered by then)
// and which never happens.
type halfDirectory struct {
	StaticDirectory
	dead    int
	reached chan struct{}
}

func (d *halfDirectory) Primary(shard int) (string, uint64, error) {
	if shard == d.dead {
		return "", 1, errors.New("test: the shard's primary is unreachable from this worker")
	}
	return d.StaticDirectory.Primary(shard)
}

func (d *halfDirectory) Changed(ctx context.Context, _ uint64) error {
	select {
	case d.reached <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestShareTakeover: a worker (share 1) dies in the middle of a step's
// push, which reached shard 0 and not shard 1. Another client takes the
// share over at its progress as the shards hold it (the last step every
// shard applied), pushes that step again (shard 0 answers it as a
// duplicate and ignores it) and goes on. The rows end bitwise those of an
// undisturbed run and every shard applied every step of every share once.
func TestShareTakeover(t *testing.T) {
	const steps, dieAt = 6, 3 // share 1's step dieAt+1 reaches shard 0 only
	grad := func(share int, step int64) []float32 {
		return []float32{float32(share+1) * 0.25 / float32(step), float32(step) * 0.125}
	}
	keys := []uint64{3, 500} // one on each shard
	for _, mode := range []Mode{BSP, SSP, ASP} {
		t.Run(mode.String(), func(t *testing.T) {
			spec := sgdTable(1)
			sync := SyncSpec{Mode: mode, Workers: 2, Staleness: 1}
			ctx := testContext(t)
			run := func(takeover bool) (rows map[uint64][]float32, infos []ShardInfo) {
				c := newCluster(t, 2, 2, 1, []TableSpec{spec}, sync)
				w0, w1 := c.client(0, PartitionHash), c.client(1, PartitionHash)
				for step := int64(1); step <= steps; step++ {
					if _, err := w0.Push(ctx, 1, keys, grad(0, step)); err != nil {
						t.Fatal(err)
					}
					if takeover && step == dieAt+1 {
						d := &halfDirectory{StaticDirectory: c.dir(), dead: 1, reached: make(chan struct{}, 1)}
						dying, err := NewClient(ClientConfig{Worker: 1, Tables: c.tables, Partition: PartitionHash, Shards: 2, Sync: sync, Directory: d})
						if err != nil {
							t.Fatal(err)
						}
						if err := dying.SetClock(1, dieAt); err != nil {
							t.Fatal(err)
						}
						pctx, cancel := context.WithCancel(ctx)
						failed := make(chan error, 1)
						go func() { _, err := dying.Push(pctx, 1, keys, grad(1, step)); failed <- err }()
						// Shard 0 applied it; then the worker dies.
						within(t, d.reached, "the dying worker's push to reach shard 0")
						cancel()
						if err := within(t, failed, "the dying worker's push to end"); err == nil {
							t.Fatal("the dying worker's push succeeded")
						}
						dying.Close()
						// The adopter: a new client of share 1 at the shards' progress.
						w1 = c.client(1, PartitionHash)
						from := int64(steps)
						for sh := range 2 {
							info, err := w1.Info(ctx, 1, sh)
							if err != nil {
								t.Fatal(err)
							}
							from = min(from, int64(info.LastIDs[1]))
						}
						if from != dieAt {
							t.Fatalf("share 1's progress %d, want %d", from, dieAt)
						}
						if err := w1.SetClock(1, from); err != nil {
							t.Fatal(err)
						}
					}
					if _, err := w1.Push(ctx, 1, keys, grad(1, step)); err != nil {
						t.Fatal(err)
					}
					if takeover && step == dieAt+1 && w1.Duplicates(1) != 1 {
						t.Fatalf("step %d pushed again: %d duplicates, want 1 (shard 0)", step, w1.Duplicates(1))
					}
				}
				out := make([]float32, 2)
				if err := w0.Pull(ctx, 1, keys, out); err != nil {
					t.Fatal(err)
				}
				rows = map[uint64][]float32{}
				for sh := range 2 {
					maps.Copy(rows, c.rows(sh, uint32(sh), 1))
					info, err := w0.Info(ctx, 1, sh)
					if err != nil {
						t.Fatal(err)
					}
					infos = append(infos, info)
				}
				return rows, infos
			}
			want, _ := run(false)
			got, infos := run(true)
			if !maps.EqualFunc(got, want, slices.Equal[[]float32]) {
				t.Fatalf("rows after the takeover %v, undisturbed %v", got, want)
			}
			for sh, info := range infos {
				for share, p := range info.Pushes {
					dups := uint64(0)
					if sh == 0 && share == 1 {
						dups = 1
					}
					if p.Last != steps || p.Applied != steps || p.Duplicates != dups || p.Base != 0 {
						t.Errorf("shard %d's account of share %d: %+v, want %d steps applied once, %d duplicates", sh, share, p, steps, dups)
					}
				}
			}
		})
	}
}

// TestClocksCounts: pushes taken and duplicates refused are counted per
// worker; a restore at clock c takes steps up to c as pushed (their ids are
// duplicates), counts from there and names c as the base.
func TestClocksCounts(t *testing.T) {
	for _, mode := range []Mode{BSP, SSP, ASP, Hybrid} {
		c, err := NewClocks(SyncSpec{Mode: mode, Workers: 1, Quorum: 1, Deadline: 1})
		if err != nil {
			t.Fatal(err)
		}
		c.restore(5)
		cases := []struct {
			id   uint64
			want PushAction
		}{{5, Duplicate}, {6, 0}, {6, Duplicate}, {7, 0}, {3, Duplicate}}
		for _, tc := range cases {
			act, err := c.Push(0, tc.id, int64(tc.id-1))
			if err != nil {
				t.Fatalf("%v: push %d: %v", mode, tc.id, err)
			}
			if (tc.want == Duplicate) != (act == Duplicate) {
				t.Fatalf("%v: push %d: %v, want duplicate %v", mode, tc.id, act, tc.want == Duplicate)
			}
			if act != Duplicate {
				c.Took(0, tc.id) // as the shard does once it applied the push
			}
			if mode.aggregates() && act != Duplicate {
				c.Close()
			}
		}
		if got, want := c.Counts(0), (PushCounts{Last: 7, Applied: 2, Duplicates: 3, Base: 5}); got != want {
			t.Errorf("%v: counts %+v, want %+v", mode, got, want)
		}
	}
}
