package collective

import (
	"errors"
	"testing"
)

func TestReduceScatterAllGatherBroadcast(t *testing.T) {
	ctx := testContext(t)
	for world := 1; world <= 6; world++ {
		groups := inprocGroups(t, world, 1, Options{SegmentBytes: 256})
		for _, n := range []int{0, 1, 5, 64, 1031, 70000} {
			inputs := make([][]float64, world)
			for r := range inputs {
				inputs[r] = randomInput[float64](r, n, uint64(n))
			}
			want := reference(inputs, Sum)
			// ReduceScatter: each rank its own range of the sum.
			mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
				lo, hi := ShardRange(n, world, r)
				out := make([]float64, hi-lo)
				in := append([]float64(nil), inputs[r]...)
				if err := g.ReduceScatter(ctx, Float64s(in), Float64s(out), Sum); err != nil {
					return err
				}
				for i := range out {
					if d := out[i] - want[lo+i]; d > 1e-9 || d < -1e-9 {
						t.Errorf("reduce-scatter world %d n %d rank %d: [%d]=%v want %v", world, n, r, lo+i, out[i], want[lo+i])
						return nil
					}
				}
				for i := range in {
					if in[i] != inputs[r][i] {
						t.Errorf("reduce-scatter modified its input")
						return nil
					}
				}
				return nil
			}))
			// AllGather: concatenation in rank order.
			mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
				out := make([]float64, n*world)
				if err := g.AllGather(ctx, Float64s(inputs[r]), Float64s(out)); err != nil {
					return err
				}
				for q := range world {
					for i := range n {
						if out[q*n+i] != inputs[q][i] {
							t.Errorf("allgather world %d n %d rank %d: block %d element %d wrong", world, n, r, q, i)
							return nil
						}
					}
				}
				return nil
			}))
			// AllGatherInPlace: bytes, each rank's ShardRange filled from its owner.
			mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
				buf := make([]byte, n)
				lo, hi := ShardRange(n, world, r)
				for i := lo; i < hi; i++ {
					buf[i] = byte(i*7 + 3)
				}
				if err := g.AllGatherInPlace(ctx, Bytes(buf)); err != nil {
					return err
				}
				for i := range buf {
					if buf[i] != byte(i*7+3) {
						t.Errorf("allgather in place world %d n %d rank %d: byte %d wrong", world, n, r, i)
						return nil
					}
				}
				return nil
			}))
			// AllGatherRanges: uneven shares, some empty.
			mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
				cuts := make([]int, world+1)
				for i := 1; i < world; i++ {
					cuts[i] = min(n, i*i*n/(world*world)) // grows quadratically: empty and large shares
				}
				cuts[world] = n
				buf := make([]float64, n)
				for i := cuts[r]; i < cuts[r+1]; i++ {
					buf[i] = float64(i) + 0.5
				}
				if err := g.AllGatherRanges(ctx, Float64s(buf), cuts); err != nil {
					return err
				}
				for i := range buf {
					if buf[i] != float64(i)+0.5 {
						t.Errorf("allgather ranges world %d n %d rank %d: element %d wrong", world, n, r, i)
						return nil
					}
				}
				return nil
			}))
			// Broadcast from every root, small and chained.
			for root := range world {
				mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
					buf := append([]float64(nil), inputs[r]...)
					if err := g.Broadcast(ctx, Float64s(buf), root); err != nil {
						return err
					}
					for i := range buf {
						if buf[i] != inputs[root][i] {
							t.Errorf("broadcast world %d n %d root %d rank %d: element %d wrong", world, n, root, r, i)
							return nil
						}
					}
					return nil
				}))
			}
		}
	}
}

func TestBroadcastLargeChain(t *testing.T) {
	groups := inprocGroups(t, 4, 1, Options{})
	n := 3<<20 + 5
	mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
		buf := make([]byte, n)
		if r == 2 {
			for i := range buf {
				buf[i] = byte(i * 7)
			}
		}
		if err := g.Broadcast(testContext(t), Bytes(buf), 2); err != nil {
			return err
		}
		for i := range buf {
			if buf[i] != byte(i*7) {
				t.Errorf("rank %d byte %d = %d", r, i, buf[i])
				return nil
			}
		}
		return nil
	}))
}

func TestBarrierAndSendRecv(t *testing.T) {
	ctx := testContext(t)
	for world := 2; world <= 5; world++ {
		groups := inprocGroups(t, world, 1, Options{SegmentBytes: 1024})
		mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
			for range 3 {
				if err := g.Barrier(ctx); err != nil {
					return err
				}
			}
			// A pipeline: rank r receives from r-1, adds itself, passes to r+1.
			acc := make([]float32, 5000)
			if r > 0 {
				if err := g.Recv(ctx, r-1, Float32s(acc)); err != nil {
					return err
				}
			}
			for i := range acc {
				acc[i] += float32(r + i)
			}
			if r < world-1 {
				if err := g.Send(ctx, r+1, Float32s(acc)); err != nil {
					return err
				}
			} else {
				for i := range acc {
					if want := float32(world*(world-1)/2 + world*i); acc[i] != want {
						t.Errorf("pipeline end: acc[%d]=%v want %v", i, acc[i], want)
						break
					}
				}
			}
			// Ring exchange with SendRecv, large enough to need both directions at once.
			out := make([]byte, 1<<20)
			in := make([]byte, 1<<20)
			for i := range out {
				out[i] = byte(r)
			}
			if err := g.SendRecv(ctx, (r+1)%world, Bytes(out), (r+world-1)%world, Bytes(in)); err != nil {
				return err
			}
			if in[0] != byte((r+world-1)%world) || in[len(in)-1] != in[0] {
				t.Errorf("rank %d received from the wrong peer: %d", r, in[0])
			}
			return g.Barrier(ctx)
		}))
	}
}

// TestMismatchedCalls: calls that disagree across ranks fail with ErrMismatch
// on every rank, never a hang or a wrong sum.
func TestMismatchedCalls(t *testing.T) {
	ctx := testContext(t)
	cases := []struct {
		name string
		call func(r int, g *Group) error
	}{
		{"length", func(r int, g *Group) error {
			return g.AllReduce(ctx, Float32s(make([]float32, 100+r)), Sum)
		}},
		{"length-zero-vs-some", func(r int, g *Group) error {
			return g.AllReduce(ctx, Float32s(make([]float32, r)), Sum)
		}},
		{"dtype", func(r int, g *Group) error {
			if r == 1 {
				return g.AllReduce(ctx, Float64s(make([]float64, 1000)), Sum)
			}
			return g.AllReduce(ctx, Float32s(make([]float32, 1000)), Sum)
		}},
		{"op", func(r int, g *Group) error {
			op := Sum
			if r == 2 {
				op = Max
			}
			return g.AllReduce(ctx, Float32s(make([]float32, 1000)), op)
		}},
		{"operation", func(r int, g *Group) error {
			if r == 0 {
				return g.Broadcast(ctx, Float32s(make([]float32, 64)), 0)
			}
			return g.AllReduce(ctx, Float32s(make([]float32, 64)), Sum)
		}},
		{"broadcast-root", func(r int, g *Group) error {
			return g.Broadcast(ctx, Float32s(make([]float32, 64)), r%2)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			groups := inprocGroups(t, 4, 1, Options{})
			errs := onEveryRank(groups, tc.call)
			for r, err := range errs {
				if !errors.Is(err, ErrMismatch) {
					// A rank may finish its part before the disagreement shows; the
					// next operation then reports it.
					if err == nil {
						err = groups[r].Barrier(ctx)
					}
					if !errors.Is(err, ErrMismatch) {
						t.Errorf("rank %d: %v, want ErrMismatch", r, err)
					}
				}
			}
		})
	}
}

func TestLocalArgumentErrors(t *testing.T) {
	groups := inprocGroups(t, 1, 1, Options{})
	g := groups[0]
	ctx := testContext(t)
	if err := g.AllReduce(ctx, Bytes(make([]byte, 4)), Sum); err == nil {
		t.Error("reducing bytes succeeded")
	}
	if err := g.ReduceScatter(ctx, Float32s(make([]float32, 4)), Float32s(make([]float32, 3)), Sum); err == nil {
		t.Error("reduce-scatter with a wrong output length succeeded")
	}
	if err := g.Broadcast(ctx, Float32s(nil), 3); err == nil {
		t.Error("broadcast from a root outside the world succeeded")
	}
	if err := g.AllReduce(ctx, Float32s(make([]float32, 4)), Sum); err != nil {
		t.Errorf("argument errors broke the group: %v", err)
	}
}
