package collective

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// halfUnit is the wire type's relative half-ulp (unit roundoff) and its
// absolute half-ulp among the subnormals.
func halfUnit(dt DType) (rel, abs float64) {
	if dt == Float16 {
		return 0x1p-11, 0x1p-25
	}
	return 0x1p-8, 0x1p-134
}

// wireLayout is a set of tensor sizes exercising several fused buckets, a
// tensor larger than a bucket, empty tensors, and a last "statistics" tensor
// the options keep exact.
var wireLayout = []int{3, 100, 0, 5000, 7, 1, 40000, 12, 12, 5}

// TestFuserWire: with a 16-bit wire every rank ends with the same bits, the
// result is within the rounding bound of the exact float64 reduction (one
// rounding of each input, one of each of the N−1 combining steps), the exact
// tensor gets float32 allreduce's bits, for both algorithms and 1 to 5 ranks.
func TestFuserWire(t *testing.T) {
	type tc struct {
		wire  DType
		world int
		algo  Algorithm
		op    ReduceOp
	}
	var cases []tc
	for _, wire := range []DType{Float16, BFloat16} {
		for world := 1; world <= 5; world++ {
			for _, algo := range []Algorithm{AlgoRing, AlgoRecursiveDoubling} {
				for _, op := range []ReduceOp{Sum, Avg} {
					cases = append(cases, tc{wire, world, algo, op})
				}
			}
		}
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/N=%d/%s/%s", c.wire, c.world, c.algo, c.op), func(t *testing.T) {
			groups := inprocGroups(t, c.world, 1, Options{Algorithm: c.algo})
			ctx := testContext(t)
			exact := len(wireLayout) - 1
			in := make([][][]float32, c.world)
			out := make([][][]float32, c.world)
			stats := make([][]float32, c.world)
			for r := range in {
				for i, n := range wireLayout {
					x := randomInput[float32](r, n, uint64(i))
					in[r] = append(in[r], x)
					out[r] = append(out[r], append([]float32(nil), x...))
				}
				stats[r] = append([]float32(nil), in[r][exact]...)
			}
			mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
				if err := AllReduceTensorsWith(ctx, g, out[r], c.op, FuserOptions{BucketBytes: 64 << 10, Wire: c.wire, Exact: []int{exact}}); err != nil {
					return err
				}
				return g.AllReduce(ctx, Float32s(stats[r]), c.op)
			}))
			rel, abs := halfUnit(c.wire)
			N := float64(c.world)
			changed := 0
			for i, n := range wireLayout {
				for j := range n {
					got := out[0][i][j]
					for r := 1; r < c.world; r++ {
						if math.Float32bits(out[r][i][j]) != math.Float32bits(got) {
							t.Fatalf("tensor %d element %d: rank %d has %v, rank 0 %v", i, j, r, out[r][i][j], got)
						}
					}
					if i == exact {
						if got != stats[0][j] {
							t.Fatalf("exact tensor element %d: %v, float32 allreduce gives %v", j, got, stats[0][j])
						}
						continue
					}
					var sum, mag float64
					for r := range c.world {
						sum += float64(in[r][i][j])
						mag += math.Abs(float64(in[r][i][j]))
					}
					bound := (2*N - 1) * (rel*mag*(1+4*rel*N) + abs)
					want := sum
					if c.op == Avg {
						want, bound = sum/N, bound/N+0x1p-24*math.Abs(sum/N)
					}
					if d := math.Abs(float64(got) - want); d > bound {
						t.Fatalf("tensor %d element %d: %v, want %v within %g (off by %g)", i, j, got, want, bound, d)
					}
					if got != float32(want) {
						changed++
					}
				}
			}
			if changed == 0 {
				t.Fatalf("no element differs from the float32 result: was anything compressed?")
			}
		})
	}
}

// TestAllReduceWire: a 16-bit buffer reduced directly by the group, with
// every op and both algorithms: the ranks agree to the bit, Min and Max are
// exact, Sum and Avg within the rounding bound.
func TestAllReduceWire(t *testing.T) {
	const n, world = 3001, 3
	for _, wire := range []DType{Float16, BFloat16} {
		for _, algo := range []Algorithm{AlgoRing, AlgoRecursiveDoubling} {
			for _, op := range []ReduceOp{Sum, Avg, Min, Max} {
				t.Run(fmt.Sprintf("%s/%s/%s", wire, algo, op), func(t *testing.T) {
					groups := inprocGroups(t, world, 1, Options{Algorithm: algo})
					in := make([][]uint16, world)
					out := make([][]uint16, world)
					for r := range world {
						in[r] = make([]uint16, n)
						encodeHalf(wire, in[r], randomInput[float32](r, n, 7))
						out[r] = append([]uint16(nil), in[r]...)
					}
					mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
						return g.AllReduce(testContext(t), Buffer{b: bytesOf(out[r]), dt: wire}, op)
					}))
					rel, abs := halfUnit(wire)
					for j := range n {
						for r := 1; r < world; r++ {
							if out[r][j] != out[0][j] {
								t.Fatalf("element %d: rank %d has %#04x, rank 0 %#04x", j, r, out[r][j], out[0][j])
							}
						}
						got := float64(halfToF32(wire, out[0][j]))
						var sum, mag float64
						lo, hi := math.Inf(1), math.Inf(-1)
						for r := range world {
							v := float64(halfToF32(wire, in[r][j]))
							sum, mag = sum+v, mag+math.Abs(v)
							lo, hi = min(lo, v), max(hi, v)
						}
						var want, bound float64
						switch op {
						case Sum:
							want, bound = sum, (world-1)*(rel*mag*1.01+abs)
						case Avg: // the sum, then one more rounding of the quotient
							want, bound = sum/world, (world-1)*(rel*mag*1.01+abs)/world+rel*math.Abs(sum/world)+abs
						case Min:
							want = lo
						case Max:
							want = hi
						}
						if d := math.Abs(got - want); d > bound {
							t.Fatalf("element %d: %v, want %v within %g", j, got, want, bound)
						}
					}
				})
			}
		}
	}
}

// TestFuserErrorFeedback: over K rounds with error feedback, the sum of the
// applied (reduced) gradients tracks the sum of the exact ones within one
// half-ulp per rank, the residues each rank still holds; without it the
// rounding bias of the same gradients adds up far beyond that. The inputs
// sit where the wire reduction itself is exact (binary16's and bfloat16's
// subnormal range, where the grid is fixed), so only the conversion of each
// rank's contribution rounds; bfloat16 on one rank is tested at unit scale.
func TestFuserErrorFeedback(t *testing.T) {
	const K, n = 64, 1000
	type tc struct {
		wire  DType
		world int
		scale float64 // of the gradients
		half  float64 // the wire type's half-ulp at that scale
	}
	cases := []tc{{BFloat16, 1, 1, 0x1p-8}}
	for world := 1; world <= 5; world++ {
		cases = append(cases, tc{Float16, world, 0x1p-17, 0x1p-25}, tc{BFloat16, world, 0x1p-130, 0x1p-134})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/N=%d/scale=%g", c.wire, c.world, c.scale), func(t *testing.T) {
			groups := inprocGroups(t, c.world, 1, Options{})
			ctx := testContext(t)
			grad := func(r, i, k int) float32 { // biased: the same fraction of a grid step most rounds
				return float32(c.scale * (0.3 + 0.37*float64(i)/n + 0.11*float64(r) + 0.001*float64((i*7+k*13)%5)))
			}
			errs := map[bool]float64{}
			for _, ef := range []bool{true, false} {
				applied := make([][]float64, c.world)
				exact := make([]float64, n)
				mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
					x := make([]float32, n)
					f, err := NewFuserWith(ctx, g, [][]float32{x[:n/2], x[n/2:]}, Sum, FuserOptions{Wire: c.wire, ErrorFeedback: ef, BucketBytes: n})
					if err != nil {
						return err
					}
					defer f.Close()
					applied[r] = make([]float64, n)
					for k := range K {
						for i := range x {
							x[i] = grad(r, i, k)
						}
						f.Reset()
						if err := f.MarkReady(0); err != nil {
							return err
						}
						if err := f.MarkReady(1); err != nil {
							return err
						}
						if err := f.Wait(ctx); err != nil {
							return err
						}
						for i, v := range x {
							applied[r][i] += float64(v)
						}
					}
					return nil
				}))
				for k := range K {
					for i := range exact {
						for r := range c.world {
							exact[i] += float64(grad(r, i, k))
						}
					}
				}
				worst := 0.0
				for i := range exact {
					for r := 1; r < c.world; r++ {
						if applied[r][i] != applied[0][i] {
							t.Fatalf("ef=%v element %d: rank %d applied %v, rank 0 %v", ef, i, r, applied[r][i], applied[0][i])
						}
					}
					worst = max(worst, math.Abs(applied[0][i]-exact[i]))
				}
				errs[ef] = worst
			}
			bound := float64(c.world) * c.half * (1 + 0x1p-10)
			if errs[true] > bound {
				t.Fatalf("with error feedback the %d-round sum is off by %g, bound %g", K, errs[true], bound)
			}
			if errs[false] < 4*bound {
				t.Fatalf("without error feedback the %d-round sum is off by only %g (bound with it %g): the test shows nothing", K, errs[false], bound)
			}
			t.Logf("worst error of the %d-round sum: %g with error feedback, %g without (bound %g)", K, errs[true], errs[false], bound)
		})
	}
}

// countingTransport counts the bytes every connection it makes writes.
type countingTransport struct {
	Transport
	written atomic.Int64
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	return n, err
}

func (t *countingTransport) Connect(ctx context.Context, m Membership) ([]net.Conn, error) {
	conns, err := t.Transport.Connect(ctx, m)
	for i, c := range conns {
		if c != nil {
			conns[i] = countingConn{c, &t.written}
		}
	}
	return conns, err
}

// countedGroups joins n ranks over an in-process network whose connections
// count the bytes written.
func countedGroups(t testing.TB, n int) ([]*Group, *countingTransport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ct := &countingTransport{Transport: NewInprocNetwork()}
	peers := make([]string, n)
	for i := range peers {
		peers[i] = fmt.Sprintf("inproc-%d", i)
	}
	trs := make([]Transport, n)
	for r := range trs {
		trs[r] = ct
	}
	groups, err := JoinAll(ctx, trs, Membership{Job: "count", Generation: 1, Peers: peers}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeGroups(groups) })
	return groups, ct
}

// TestFuserWireBytes: a 16-bit wire halves the bytes on the wire (frame
// headers aside) for the same tensors.
func TestFuserWireBytes(t *testing.T) {
	const elems = 1 << 20 // 4 MiB of float32
	for _, world := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("N=%d", world), func(t *testing.T) {
			groups, ct := countedGroups(t, world)
			ctx := testContext(t)
			bytes := map[DType]int64{}
			for _, wire := range []DType{Float32, Float16, BFloat16} {
				before := ct.written.Load()
				mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
					x := randomInput[float32](r, elems, 1)
					return AllReduceTensorsWith(ctx, g, [][]float32{x[:elems/2], x[elems/2:]}, Avg, FuserOptions{Wire: wire})
				}))
				bytes[wire] = ct.written.Load() - before
			}
			payload := int64(2 * (world - 1) * elems * 4) // the ring moves 2(N−1)/N of the tensor per rank
			if bytes[Float32] < payload {
				t.Fatalf("float32: %d bytes written, the ring alone moves %d", bytes[Float32], payload)
			}
			for _, wire := range []DType{Float16, BFloat16} {
				ratio := float64(bytes[wire]) / float64(bytes[Float32])
				if ratio < 0.49 || ratio > 0.51 {
					t.Errorf("%s: %d bytes against float32's %d: ratio %.4f, want 0.5", wire, bytes[wire], bytes[Float32], ratio)
				}
				t.Logf("%s: %d bytes, float32 %d: ratio %.4f", wire, bytes[wire], bytes[Float32], ratio)
			}
		})
	}
}

// stepper runs one Fuser round per call on every rank: rank 0 on the calling
// goroutine, the others on goroutines started once, so a round itself starts
// no goroutine and allocates nothing of the test's own.
type stepper struct {
	start []chan struct{}
	done  chan error
	round func(r int) error
}

func newStepper(t testing.TB, world int, round func(r int) error) *stepper {
	s := &stepper{start: make([]chan struct{}, world), done: make(chan error, world), round: round}
	for r := 1; r < world; r++ {
		s.start[r] = make(chan struct{})
		go func() {
			for range s.start[r] {
				s.done <- round(r)
			}
		}()
	}
	t.Cleanup(func() {
		for _, c := range s.start[1:] {
			close(c)
		}
	})
	return s
}

func (s *stepper) step() error {
	for _, c := range s.start[1:] {
		c <- struct{}{}
	}
	err := s.round(0)
	for range s.start[1:] {
		// Bounded by the rounds' own contexts (testContext), whose end fails
		// them; a timer here would allocate in the measured rounds.
		if e := <-s.done; err == nil {
			err = e
		}
	}
	return err
}

// fuserRound is one training step's use of a Fuser: reset, mark every tensor
// ready (backward order), wait.
func fuserRound(ctx context.Context, f *Fuser[float32], tensors int) error {
	f.Reset()
	for i := range tensors {
		if err := f.MarkReady(i); err != nil {
			return err
		}
	}
	return f.Wait(ctx)
}

// TestFuserWireAllocs: a step of a compressed Fuser, with error feedback,
// allocates nothing once running, on any rank.
func TestFuserWireAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	for _, wire := range []DType{Float32, Float16, BFloat16} {
		t.Run(wire.String(), func(t *testing.T) {
			const world = 3
			groups := inprocGroups(t, world, 1, Options{})
			ctx := testContext(t)
			fusers := make([]*Fuser[float32], world)
			for r := range world {
				var ts [][]float32
				for i, n := range wireLayout {
					ts = append(ts, randomInput[float32](r, n, uint64(i)))
				}
				f, err := NewFuserWith(ctx, groups[r], ts, Avg, FuserOptions{BucketBytes: 64 << 10, Wire: wire, ErrorFeedback: wire.Half(), Exact: []int{len(ts) - 1}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(f.Close)
				fusers[r] = f
			}
			s := newStepper(t, world, func(r int) error { return fuserRound(ctx, fusers[r], len(wireLayout)) })
			var err error
			allocs := testing.AllocsPerRun(20, func() {
				if e := s.step(); e != nil && err == nil {
					err = e
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if allocs != 0 {
				t.Fatalf("%v allocations per step, want 0", allocs)
			}
		})
	}
}

// TestFuserOptionsRefused: options that cannot work are refused when the
// Fuser is made.
func TestFuserOptionsRefused(t *testing.T) {
	groups := inprocGroups(t, 1, 1, Options{})
	ctx := testContext(t)
	f32 := [][]float32{{1, 2}}
	f64 := [][]float64{{1, 2}}
	cases := []struct {
		name string
		make func() error
	}{
		{"uint8 wire", func() error { _, err := NewFuserWith(ctx, groups[0], f32, Sum, FuserOptions{Wire: Uint8}); return err }},
		{"float64 wire for float32", func() error {
			_, err := NewFuserWith(ctx, groups[0], f32, Sum, FuserOptions{Wire: Float64})
			return err
		}},
		{"fp16 wire for float64", func() error {
			_, err := NewFuserWith(ctx, groups[0], f64, Sum, FuserOptions{Wire: Float16})
			return err
		}},
		{"feedback without a wire", func() error {
			_, err := NewFuserWith(ctx, groups[0], f32, Sum, FuserOptions{ErrorFeedback: true})
			return err
		}},
		{"exact out of range", func() error {
			_, err := NewFuserWith(ctx, groups[0], f32, Sum, FuserOptions{Wire: Float16, Exact: []int{1}})
			return err
		}},
		{"feedback in AllReduceTensors", func() error {
			return AllReduceTensorsWith(ctx, groups[0], f32, Sum, FuserOptions{Wire: Float16, ErrorFeedback: true})
		}},
	}
	for _, c := range cases {
		if c.make() == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	f, err := NewFuserWith(ctx, groups[0], f64, Sum, FuserOptions{Wire: Float64}) // its own type: no conversion
	if err != nil {
		t.Fatalf("float64 wire for float64 tensors: %v", err)
	}
	f.Close()
}

// TestFuserWireState: Exact changes nothing without a 16-bit wire;
// ClearResidues makes a Fuser with error feedback behave as a fresh one.
func TestFuserWireState(t *testing.T) {
	groups := inprocGroups(t, 1, 1, Options{})
	ctx := testContext(t)
	ts := [][]float32{{1, 2}, {3}, {4, 5, 6}}
	plain := NewFuser(ctx, groups[0], ts, Sum, 12)
	defer plain.Close()
	same, err := NewFuserWith(ctx, groups[0], ts, Sum, FuserOptions{BucketBytes: 12, Exact: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if plain.Buckets() != same.Buckets() {
		t.Errorf("Exact without a wire: %d buckets, NewFuser makes %d", same.Buckets(), plain.Buckets())
	}
	x := []float32{0.1, 1.0 / 3, 1e-3}
	ef, err := NewFuserWith(ctx, groups[0], [][]float32{x}, Sum, FuserOptions{Wire: Float16, ErrorFeedback: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	var first []float32
	for round := range 3 {
		copy(x, []float32{0.1, 1.0 / 3, 1e-3})
		if round == 2 {
			ef.ClearResidues()
		}
		if err := fuserRound(ctx, ef, 1); err != nil {
			t.Fatal(err)
		}
		switch round {
		case 0:
			first = append([]float32(nil), x...)
		case 1:
			if slices.Equal(x, first) {
				t.Errorf("round 1 gave round 0's %v: no residue carried", x)
			}
		case 2:
			if !slices.Equal(x, first) {
				t.Errorf("after ClearResidues got %v, a fresh Fuser gives %v", x, first)
			}
		}
	}
}

// BenchmarkFuserWire: one Fuser round (reset, mark ready, wait) on 4
// in-process ranks, float32 against the 16-bit wires with error feedback.
// MB/s counts the float32 gradient bytes reduced per second.
func BenchmarkFuserWire(b *testing.B) {
	const world = 4
	for _, size := range []int{1 << 20, 16 << 20} {
		for _, wire := range []DType{Float32, Float16, BFloat16} {
			b.Run(fmt.Sprintf("%dMiB/%s", size>>20, wire), func(b *testing.B) {
				groups := inprocGroups(b, world, 1, Options{})
				ctx := testContext(b)
				fusers := make([]*Fuser[float32], world)
				const parts = 4
				for r := range world {
					var ts [][]float32
					for i := range parts {
						ts = append(ts, randomInput[float32](r, size/4/parts, uint64(i)))
					}
					f, err := NewFuserWith(ctx, groups[r], ts, Avg, FuserOptions{BucketBytes: size, Wire: wire, ErrorFeedback: wire.Half()})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(f.Close)
					fusers[r] = f
				}
				s := newStepper(b, world, func(r int) error { return fuserRound(ctx, fusers[r], parts) })
				if err := s.step(); err != nil { // the groups' scratch buffers grow once
					b.Fatal(err)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if err := s.step(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
