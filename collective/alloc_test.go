package collective

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestSteadyStateAllocs: once running, a collective allocates nothing, on
// any rank: allreduce (ring and recursive doubling), allgather, broadcast
// and barrier, over the in-process transport, over real loopback TCP
// (sockets, the poller, writev) and over shared memory, at a
// size below and one above a shared-memory slab. testing.AllocsPerRun
// counts the whole process's allocations, every rank's goroutines with the
// calling one's; the ranks run on goroutines started once (stepper), so a
// round starts none of the test's own. The operations get a cancellable
// context, as a worker's do: context.Background() hid the shared-memory
// path's per-operation context watch (three allocations a rank).
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector; the non-race pass (go test without -race, as scripts/test runs it) runs this test")
	}
	const world = 4
	planes := []struct {
		name string
		join func(t *testing.T) []*Group
	}{
		{"inproc", func(t *testing.T) []*Group { return inprocGroups(t, world, 1, Options{}) }},
		{"tcp", func(t *testing.T) []*Group {
			s := newShmRanks(t, world, TransportTCP, t.TempDir())
			groups := s.join(t, "allocs", 1, []int{0, 1, 2, 3}, nil, Options{})
			if p := groups[0].DataPlane(); planeOf(p) != "tcp" {
				t.Fatalf("data plane %q, want tcp", p)
			}
			return groups
		}},
		{"shm", func(t *testing.T) []*Group {
			s := newShmRanks(t, world, TransportShm, t.TempDir())
			groups := s.join(t, "allocs", 1, []int{0, 1, 2, 3}, nil, Options{})
			if p := groups[0].DataPlane(); planeOf(p) != "shm" {
				t.Fatalf("data plane %q, want shm", p)
			}
			return groups
		}},
	}
	// 1000 elements fit a 64 KiB slab (newShmRanks's); 40000 do not.
	for _, count := range []int{1000, 40000} {
		ops := []struct {
			name string
			op   func(ctx context.Context, g *Group, r int, b *allocBufs) error
		}{
			{"allreduce-ring", func(ctx context.Context, g *Group, r int, b *allocBufs) error {
				return g.AllReduceWith(ctx, Float32s(b.x[r]), Sum, AlgoRing)
			}},
			{"allreduce-rd", func(ctx context.Context, g *Group, r int, b *allocBufs) error {
				return g.AllReduceWith(ctx, Float32s(b.x[r]), Sum, AlgoRecursiveDoubling)
			}},
			{"allgather", func(ctx context.Context, g *Group, r int, b *allocBufs) error {
				return g.AllGather(ctx, Float32s(b.x[r][:count/world]), Float32s(b.out[r]))
			}},
			{"broadcast", func(ctx context.Context, g *Group, r int, b *allocBufs) error {
				return g.Broadcast(ctx, Float32s(b.x[r]), 1)
			}},
			{"barrier", func(ctx context.Context, g *Group, r int, b *allocBufs) error { return g.Barrier(ctx) }},
		}
		for _, plane := range planes {
			for _, o := range ops {
				if o.name == "barrier" && count != 1000 {
					continue // no data: one size says it all
				}
				t.Run(plane.name+"/"+o.name+"/"+strconv.Itoa(count), func(t *testing.T) {
					groups := plane.join(t)
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					b := &allocBufs{}
					for range world {
						b.x = append(b.x, make([]float32, count))
						b.out = append(b.out, make([]float32, count/world*world))
					}
					s := newStepper(t, world, func(r int) error { return o.op(ctx, groups[r], r, b) })
					for range 3 { // warm-up: buffers and links made on first use
						if err := s.step(); err != nil {
							t.Fatal(err)
						}
					}
					var err error
					allocs := testing.AllocsPerRun(50, func() {
						if e := s.step(); e != nil && err == nil {
							err = e
						}
					})
					if err != nil {
						t.Fatal(err)
					}
					if allocs != 0 {
						t.Errorf("%v allocations per %s of %d float32 on %d ranks over %s, want 0", allocs, o.name, count, world, plane.name)
					}
				})
			}
		}
	}
}

// allocBufs are each rank's input and output buffers, made before the
// measured rounds.
type allocBufs struct{ x, out [][]float32 }
