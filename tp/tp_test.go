package tp

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// groups is a tensor-parallel group of size ranks over an in-process
// network, closed with the test.
func groups(t *testing.T, ctx context.Context, size int) []*collective.Group {
	t.Helper()
	gs, err := collective.InprocGroups(ctx, size, t.Name(), 1, collective.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { collective.CloseGroups(gs) })
	return gs
}

// twin is the unsplit model: Dense(in→hidden), GELU, Dense(hidden→out),
// its weights from seed alone, so every rank builds the same.
func twin(seed uint64, in, hidden, out int) (*nn.Dense, *nn.Dense) {
	rng := rand.New(rand.NewPCG(seed, 1))
	a, b := nn.NewDense("a", in, hidden, rng), nn.NewDense("b", hidden, out, rng)
	for _, d := range []*nn.Dense{a, b} {
		for i := range d.B.Value {
			d.B.Value[i] = float32(0.1 * rng.NormFloat64())
		}
	}
	return a, b
}

func randMatrix(seed uint64, rows, cols int) nn.Matrix {
	rng := rand.New(rand.NewPCG(seed, 2))
	m := nn.Matrix{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
	for i := range m.Data {
		m.Data[i] = float32(rng.NormFloat64())
	}
	return m
}

func near(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > 1e-5*max(scale, 1) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// colsOf is columns [lo, hi) of the rows × cols data.
func colsOf(data []float32, cols, lo, hi int) []float32 {
	var out []float32
	for r := 0; r < len(data)/cols; r++ {
		out = append(out, data[r*cols+lo:r*cols+hi]...)
	}
	return out
}

// TestMegatronMLPEqualsTwin: the Megatron MLP (ColumnParallel, GELU on
// the split hidden layer, RowParallel) and a ColumnParallel that gathers
// its output give, at T = 1, 2 and 4 (the hidden width 7 cut unevenly),
// each rank's output and input gradient equal to the unsplit twin's, and
// each rank's slice of every parameter gradient equal to the twin's slice,
// within 1e-5 relative, over two steps (buffers reused).
func TestMegatronMLPEqualsTwin(t *testing.T) {
	const in, hidden, out, rows = 5, 7, 4, 3
	for _, gather := range []bool{false, true} {
		for _, size := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("T%d/gather=%v", size, gather), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				gs := groups(t, ctx, size)
				refA, refB := twin(9, in, hidden, out)
				ref := nn.NewSequential(refA, &nn.GELU{}, refB)
				refA.SkipInputGrad = false
				type result struct {
					y, dx              []float32
					wa, ba, wb, bb     []float32
					alo, ahi, blo, bhi int
				}
				for step := range 2 {
					x, dy := randMatrix(uint64(10+step), rows, in), randMatrix(uint64(20+step), rows, out)
					nn.ZeroGrads(ref.Params())
					wantY := append([]float32(nil), ref.Forward(x).Data...)
					wantDX := append([]float32(nil), ref.Backward(dy, nil).Data...)
					res := make([]result, size)
					var wg sync.WaitGroup
					errs := make([]error, size)
					for r, g := range gs {
						wg.Add(1)
						go func() {
							defer wg.Done()
							comm := NewComm(ctx, g)
							a0, b0 := twin(9, in, hidden, out)
							col := NewColumnParallel(comm, a0, gather)
							col.Local.SkipInputGrad = false
							var layers []nn.Layer
							var row *RowParallel
							var plain *nn.Dense
							if gather {
								plain = b0
								layers = []nn.Layer{col, &nn.GELU{}, plain}
							} else {
								row = NewRowParallel(comm, b0, true)
								layers = []nn.Layer{col, &nn.GELU{}, row}
							}
							seq := nn.NewSequential(layers...)
							for s := range 2 { // the same two steps: the second reuses every buffer
								xs, dys := randMatrix(uint64(10+s), rows, in), randMatrix(uint64(20+s), rows, out)
								nn.ZeroGrads(seq.Params())
								y := seq.Forward(xs)
								dx := seq.Backward(dys, nil)
								if s != step {
									continue
								}
								rs := result{y: append([]float32(nil), y.Data...), dx: append([]float32(nil), dx.Data...),
									wa: col.Local.W.Grad, ba: col.Local.B.Grad}
								rs.alo, rs.ahi = col.Range()
								if row != nil {
									rs.wb, rs.bb = row.Local.W.Grad, row.B.Grad
									rs.blo, rs.bhi = row.Range()
								} else {
									rs.wb, rs.bb, rs.blo, rs.bhi = plain.W.Grad, plain.B.Grad, 0, hidden
								}
								res[r] = rs
								break
							}
							errs[r] = comm.Err()
						}()
					}
					wg.Wait()
					for r, err := range errs {
						if err != nil {
							t.Fatalf("rank %d: %v", r, err)
						}
					}
					for r, rs := range res {
						p := fmt.Sprintf("step %d, rank %d: ", step, r)
						near(t, p+"output", rs.y, wantY)
						near(t, p+"input gradient", rs.dx, wantDX)
						near(t, p+"a.W gradient (its columns)", rs.wa, colsOf(refA.W.Grad, hidden, rs.alo, rs.ahi))
						near(t, p+"a.b gradient (its columns)", rs.ba, refA.B.Grad[rs.alo:rs.ahi])
						near(t, p+"b.W gradient (its rows)", rs.wb, refB.W.Grad[rs.blo*out:rs.bhi*out])
						near(t, p+"b.b gradient", rs.bb, refB.B.Grad)
					}
				}
			})
		}
	}
}

// TestLostPeerIsAnError: when the group fails under a layer's collective,
// the layer passes zeros on and the Comm keeps the failure for the
// caller, naming the operation; nothing panics or hangs.
func TestLostPeerIsAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gs := groups(t, ctx, 2)
	gs[1].Abort("rank 1 is gone")
	comm := NewComm(ctx, gs[0])
	a, b := twin(9, 5, 6, 4)
	seq := nn.NewSequential(NewColumnParallel(comm, a, false), NewRowParallel(comm, b, true))
	y := seq.Forward(randMatrix(1, 3, 5))
	seq.Backward(randMatrix(2, 3, 4), nil)
	if err := comm.Err(); err == nil || !strings.Contains(err.Error(), "row-parallel output") {
		t.Fatalf("Err() = %v, want the row-parallel output's all-reduce failure", err)
	}
	for i, v := range y.Data {
		if v != b.B.Value[i%4] { // zeros from the failed sum, then the bias
			t.Fatalf("output[%d] = %v after the failure, want the bias alone", i, v)
		}
	}
}

// TestCommAtOneRankNeedsNoGroup: layers built on NewCommAt(1, 0) run
// without a group, equal to the unsplit layers; a group of another shape
// is refused by Use.
func TestCommAtOneRankNeedsNoGroup(t *testing.T) {
	comm, err := NewCommAt(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := twin(3, 4, 6, 2)
	refA, refB := twin(3, 4, 6, 2)
	seq := nn.NewSequential(NewColumnParallel(comm, a, false), &nn.GELU{}, NewRowParallel(comm, b, true))
	ref := nn.NewSequential(refA, &nn.GELU{}, refB)
	x := randMatrix(1, 3, 4)
	near(t, "output", seq.Forward(x).Data, ref.Forward(x).Data)
	if comm.Err() != nil {
		t.Fatal(comm.Err())
	}
	if _, err := NewCommAt(2, 2); err == nil {
		t.Error("rank 2 of 2 accepted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gs := groups(t, ctx, 2)
	c2, _ := NewCommAt(2, 0)
	if err := c2.Use(ctx, gs[1]); err == nil || !strings.Contains(err.Error(), "this rank is 1 of 2, for layers built as rank 0 of 2") {
		t.Errorf("rank 1's group for rank 0's layers: %v", err)
	}
	if err := c2.Use(ctx, gs[0]); err != nil {
		t.Error(err)
	}
}

// TestCommAtOneRankLoss: the vocabulary-parallel loss and embedding on
// NewCommAt(1, 0), with no group, equal the whole-vocabulary ones.
func TestCommAtOneRankLoss(t *testing.T) {
	comm, _ := NewCommAt(1, 0)
	logits := randMatrix(4, 3, 5)
	labels := []int32{0, 4, 2}
	var ref nn.SoftmaxCrossEntropy
	wantSum, wantRight, wantGrad, err := ref.Loss(logits, labels, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]float32(nil), wantGrad.Data...)
	sum, right, grad, err := NewVocabParallelLoss(comm, 5).Loss(logits, labels, 0.5)
	if err != nil || math.Abs(sum-wantSum) > 1e-9*math.Abs(wantSum) || right != wantRight {
		t.Fatalf("loss %v (%d right), %v; want %v (%d right)", sum, right, err, wantSum, wantRight)
	}
	near(t, "gradient", grad.Data, want)
	e := nn.NewEmbedding("e", 5, 3, rand.New(rand.NewPCG(1, 2)))
	got, err := NewVocabParallelEmbedding(comm, e).Lookup(labels)
	if err != nil {
		t.Fatal(err)
	}
	wantRows, _ := e.Lookup(labels)
	near(t, "embedding", got.Data, wantRows.Data)
}

// TestCommSpentCountsCollectives: the time between each collective's
// start and end, by the Comm's clock, adds up in Spent; the layers'
// own computing does not.
func TestCommSpentCountsCollectives(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gs := groups(t, ctx, 2)
	var wg sync.WaitGroup
	spent := make([]time.Duration, 2)
	for r, g := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comm := NewComm(ctx, g)
			var ticks int64
			comm.Now = func() time.Time { ticks++; return time.Unix(0, ticks*int64(time.Millisecond)) }
			_, b := twin(3, 4, 6, 2)
			row := NewRowParallel(comm, b, true)
			lo, hi := row.Range()
			row.Forward(randMatrix(1, 3, hi-lo)) // one all-reduce: g
			spent[r] = comm.Spent()
		}()
	}
	wg.Wait()
	for r, s := range spent {
		if s != time.Millisecond {
			t.Errorf("rank %d: %v in collectives, want one tick (1ms) for the one all-reduce", r, s)
		}
	}
}
