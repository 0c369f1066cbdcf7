package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// mlp is the examples' MLP shape on one fixed batch: what one rank computes
// in a step, without the allreduce.
type mlp struct {
	seq    *Sequential
	loss   SoftmaxCrossEntropy
	x      Matrix
	labels []int32
}

func newMLP(widths []int, batch int, seed uint64) *mlp {
	rng := rand.New(rand.NewPCG(seed, 7))
	var layers []Layer
	for i := 0; i+1 < len(widths); i++ {
		if i > 0 {
			layers = append(layers, &ReLU{})
		}
		layers = append(layers, NewDense(fmt.Sprintf("d%d", i+1), widths[i], widths[i+1], rng))
	}
	m := &mlp{seq: NewSequential(layers...), x: Matrix{Rows: batch, Cols: widths[0], Data: make([]float32, batch*widths[0])}, labels: make([]int32, batch)}
	for i := range m.x.Data {
		m.x.Data[i] = float32(rng.Float64())
	}
	for i := range m.labels {
		m.labels[i] = int32(rng.IntN(widths[len(widths)-1]))
	}
	return m
}

// step is forward, loss and backward, leaving the gradients in the params.
func (m *mlp) step() (float64, error) {
	ZeroGrads(m.seq.Params())
	sum, _, grad, err := m.loss.Loss(m.seq.Forward(m.x), m.labels, 1/float32(m.x.Rows))
	if err != nil {
		return 0, err
	}
	m.seq.Backward(grad, nil)
	return sum, nil
}

// bits is the loss and every gradient, as bit patterns.
func (m *mlp) bits(sum float64) []uint32 {
	out := []uint32{uint32(math.Float64bits(sum)), uint32(math.Float64bits(sum) >> 32)}
	for _, p := range m.seq.Params() {
		for _, g := range p.Grad {
			out = append(out, math.Float32bits(g))
		}
	}
	return out
}

func TestBLASNamed(t *testing.T) {
	name := BLAS()
	if !strings.HasPrefix(name, "gonum") && !strings.HasPrefix(name, "openblas") {
		t.Errorf("BLAS() = %q: want gonum or openblas", name)
	}
	t.Logf("BLAS: %s", name)
}

// TestGemm checks every transpose combination, with strides wider than the
// rows, against a float64 product.
func TestGemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	mat := func(rows, cols int) blas32.General {
		g := blas32.General{Rows: rows, Cols: cols, Stride: cols + 3, Data: make([]float32, rows*(cols+3))}
		for i := range g.Data {
			g.Data[i] = float32(rng.NormFloat64())
		}
		return g
	}
	at := func(g blas32.General, tr blas.Transpose, i, j int) float64 {
		if tr != blas.NoTrans {
			i, j = j, i
		}
		return float64(g.Data[i*g.Stride+j])
	}
	const m, n, k = 37, 29, 53
	for _, tc := range []struct{ tA, tB blas.Transpose }{
		{blas.NoTrans, blas.NoTrans}, {blas.Trans, blas.NoTrans}, {blas.NoTrans, blas.Trans}, {blas.Trans, blas.Trans},
	} {
		t.Run(fmt.Sprintf("%c%c", tc.tA, tc.tB), func(t *testing.T) {
			a, b := mat(m, k), mat(k, n)
			if tc.tA != blas.NoTrans {
				a = mat(k, m)
			}
			if tc.tB != blas.NoTrans {
				b = mat(n, k)
			}
			c := mat(m, n)
			c0 := append([]float32(nil), c.Data...)
			gemm(tc.tA, tc.tB, 0.5, a, b, 2, c)
			for i := range m {
				for j := range n {
					want := 2 * float64(c0[i*c.Stride+j])
					for l := range k {
						want += 0.5 * at(a, tc.tA, i, l) * at(b, tc.tB, l, j)
					}
					if got := float64(c.Data[i*c.Stride+j]); math.Abs(got-want) > 1e-4*(1+math.Abs(want)) {
						t.Fatalf("c[%d,%d] = %v, want %v", i, j, got, want)
					}
				}
				for j := n; j < c.Stride; j++ {
					if c.Data[i*c.Stride+j] != c0[i*c.Stride+j] {
						t.Fatalf("c[%d,%d] beyond the columns changed", i, j)
					}
				}
			}
		})
	}
}

func TestGemmRefusesBadShapes(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a 2x3 by 4x2 product did not panic")
		}
	}()
	gemm(blas.NoTrans, blas.NoTrans, 1, blas32.General{Rows: 2, Cols: 3, Stride: 3, Data: make([]float32, 6)},
		blas32.General{Rows: 4, Cols: 2, Stride: 2, Data: make([]float32, 8)}, 0,
		blas32.General{Rows: 2, Cols: 2, Stride: 2, Data: make([]float32, 4)})
}

// TestBitwiseReproducible: the same step on the same inputs gives the same
// bits, run again and run on two goroutines at once, as every rank of a job
// runs it. Shapes are large enough for the BLAS's blocked kernels.
func TestBitwiseReproducible(t *testing.T) {
	widths, batch := []int{784, 256, 128, 10}, 96
	run := func() ([]uint32, error) {
		m := newMLP(widths, batch, 42)
		if _, err := m.step(); err != nil {
			return nil, err
		}
		// A second step on the same model reuses every buffer.
		sum, err := m.step()
		if err != nil {
			return nil, err
		}
		return m.bits(sum), nil
	}
	want, err := run()
	if err != nil {
		t.Fatal(err)
	}
	same := func(who string, got []uint32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d values, want %d", who, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: value %d is %#x, want %#x (%s)", who, i, got[i], want[i], BLAS())
			}
		}
	}
	again, err := run()
	if err != nil {
		t.Fatal(err)
	}
	same("run again", again)

	var wg sync.WaitGroup
	got := make([][]uint32, 2)
	errs := make([]error, 2)
	for g := range got {
		wg.Go(func() { got[g], errs[g] = run() })
	}
	wg.Wait()
	for g := range got {
		if errs[g] != nil {
			t.Fatal(errs[g])
		}
		same(fmt.Sprintf("goroutine %d", g), got[g])
	}
}

// TestStepAllocatesNothing: once the buffers exist, a step of Dense, ReLU
// and softmax cross-entropy, forward and backward, allocates nothing: on a
// small model, and on the README's MLP at batch 256. In the pure-Go build
// the large model's products span 4 or more 64×64 blocks, where gonum's
// Sgemm starts a goroutine per block: there every allocation of a step must
// be gonum's, none ours.
func TestStepAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		widths []int
		batch  int
		// large: some product spans 4 or more 64×64 blocks, where gonum's
		// pure-Go Sgemm starts a goroutine per block.
		large bool
	}{
		{"small", []int{64, 32, 32, 10}, 16, false},
		{"mlp-784-512-512-10", []int{784, 512, 512, 10}, 256, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMLP(tc.widths, tc.batch, 1)
			if _, err := m.step(); err != nil {
				t.Fatal(err)
			}
			var err error
			step := func() {
				if _, e := m.step(); e != nil {
					err = e
				}
			}
			if tc.large && blasAllocates {
				sites := allocationSites(10, "github.com/phalanx-rt/phalanx/nn.(*mlp).step", step)
				if err != nil {
					t.Fatal(err)
				}
				var gonum int64
				for _, s := range sites {
					if !strings.Contains(s.stack, gonumParallelSgemm) {
						t.Errorf("%s: %d allocations in 10 steps outside gonum's parallel Sgemm, at:\n%s", BLAS(), s.objects, s.stack)
					}
					gonum += s.objects
				}
				if gonum == 0 {
					// The exception above is for gonum's goroutines: if they no
					// longer allocate, this build must allocate nothing too.
					t.Errorf("%s: no allocation in gonum's parallel Sgemm; drop the exception", BLAS())
				}
				return
			}
			allocs := testing.AllocsPerRun(10, step)
			if err != nil {
				t.Fatal(err)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per step, want 0", allocs)
			}
		})
	}
}

// gonumParallelSgemm is the function (and its closures) that starts a
// goroutine per 64×64 block of a large product in gonum's pure-Go BLAS.
const gonumParallelSgemm = "gonum.org/v1/gonum/blas/gonum.sgemmParallel"

// allocSite is where objects were allocated: the call stack, a function a
// line, innermost first.
type allocSite struct {
	stack   string
	objects int64
}

// allocationSites runs f n times with every allocation recorded
// (runtime.MemProfileRate = 1) and returns the sites whose stack passes
// through the function named within: what f allocated, without the
// runtime's background work or the profiling's own.
func allocationSites(n int, within string, f func()) []allocSite {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	// A profile is published by the garbage collections after the
	// allocations (up to two cycles late).
	settle := func() map[[32]uintptr]int64 {
		for range 3 {
			runtime.GC()
		}
		var recs []runtime.MemProfileRecord
		k, _ := runtime.MemProfile(nil, true)
		for {
			recs = make([]runtime.MemProfileRecord, k+50)
			var ok bool
			if k, ok = runtime.MemProfile(recs, true); ok {
				recs = recs[:k]
				break
			}
		}
		out := make(map[[32]uintptr]int64, len(recs))
		for _, r := range recs {
			out[r.Stack0] += r.AllocObjects
		}
		return out
	}
	before := settle()
	for range n {
		f()
	}
	after := settle()
	var sites []allocSite
	for stk, objs := range after {
		if d := objs - before[stk]; d > 0 {
			var b strings.Builder
			inside := false
			frames := runtime.CallersFrames(slices.DeleteFunc(stk[:], func(pc uintptr) bool { return pc == 0 }))
			for {
				fr, more := frames.Next()
				fmt.Fprintf(&b, "  %s (%s:%d)\n", fr.Function, fr.File, fr.Line)
				inside = inside || fr.Function == within
				if !more {
					break
				}
			}
			if inside {
				sites = append(sites, allocSite{stack: b.String(), objects: d})
			}
		}
	}
	return sites
}
