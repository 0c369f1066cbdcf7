package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// scale is a plain Layer, not Slotted: y = x⊙s per column, with one cache
// (the input, which its backward needs).
type scale struct {
	s     *Param
	x     Matrix
	y, dx []float32
}

func newScale(name string, width int, rng *rand.Rand) *scale {
	l := &scale{s: NewParam(name+".s", width)}
	for i := range l.s.Value {
		l.s.Value[i] = 2 + float32(rng.NormFloat64()*0.1)
	}
	return l
}

func (l *scale) Params() []*Param { return []*Param{l.s} }

func (l *scale) Forward(x Matrix) Matrix {
	l.x = x
	y := resize(&l.y, x.Rows, x.Cols)
	for i := range x.Rows {
		for j, v := range x.Row(i) {
			y.Row(i)[j] = v * l.s.Value[j]
		}
	}
	return y
}

func (l *scale) Backward(dy Matrix) Matrix {
	dx := resize(&l.dx, dy.Rows, dy.Cols)
	for i := range dy.Rows {
		for j, v := range dy.Row(i) {
			l.s.Grad[j] += v * l.x.Row(i)[j]
			dx.Row(i)[j] = v * l.s.Value[j]
		}
	}
	return dx
}

// stageModel builds the same layers for the same seed: Dense and ReLU
// alternating through widths, with a plain scale layer after each ReLU when
// plain is set.
func stageModel(seed uint64, widths []int, plain bool) []Layer {
	rng := rand.New(rand.NewPCG(seed, 11))
	var ls []Layer
	for i := 0; i+1 < len(widths); i++ {
		if i == 1 && !plain { // the transformer's slotted layers too
			ls = append(ls, NewLayerNorm("ln1", widths[i]), &GELU{})
		} else if i > 0 {
			ls = append(ls, &ReLU{})
			if plain {
				ls = append(ls, newScale(fmt.Sprintf("s%d", i), widths[i], rng))
			}
		}
		d := NewDense(fmt.Sprintf("d%d", i), widths[i], widths[i+1], rng)
		for j := range d.B.Value {
			d.B.Value[j] = float32(rng.NormFloat64() * 0.1)
		}
		ls = append(ls, d)
	}
	return ls
}

// micro is one micro-batch: its input and the gradient of its output.
type micro struct{ x, dy Matrix }

func randMatrix(rng *rand.Rand, rows, cols int) Matrix {
	m := Matrix{Rows: rows, Cols: cols, Data: make([]float32, rows*cols)}
	for i := range m.Data {
		m.Data[i] = float32(rng.NormFloat64())
	}
	return m
}

// micros makes one micro-batch per entry of rows, for a model of widths.
// The tests put the largest first, so that a buffer shared by mistake among
// slots is never reallocated apart, and overwrites another slot's.
func micros(seed uint64, widths []int, rows ...int) []micro {
	rng := rand.New(rand.NewPCG(seed, 13))
	ms := make([]micro, len(rows))
	for i, r := range rows {
		ms[i] = micro{randMatrix(rng, r, widths[0]), randMatrix(rng, r, widths[len(widths)-1])}
	}
	return ms
}

func clone(m Matrix) Matrix {
	return Matrix{Rows: m.Rows, Cols: m.Cols, Data: slices.Clone(m.Data)}
}

// sameBits fails unless got and want are equal bit for bit.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func sameMatrix(t *testing.T, what string, got, want Matrix) {
	t.Helper()
	if got.Rows != want.Rows || got.Cols != want.Cols {
		t.Fatalf("%s: %d×%d, want %d×%d", what, got.Rows, got.Cols, want.Rows, want.Cols)
	}
	sameBits(t, what, got.Data, want.Data)
}

func sameGrads(t *testing.T, got, want []*Param) {
	t.Helper()
	for i, p := range got {
		sameBits(t, p.Name+".Grad", p.Grad, want[i].Grad)
	}
}

// stageOps: F is Forward, B Backward, I BackwardInput, W BackwardWeight.
type stageOp struct {
	kind  byte
	micro int
}

func parseOps(s string) []stageOp {
	var ops []stageOp
	for i := 0; i < len(s); i += 3 {
		ops = append(ops, stageOp{s[i], int(s[i+1] - '0')})
	}
	return ops
}

// reference runs each micro-batch alone through a Sequential of the same
// layers, Forward then Backward, in order, accumulating the gradients:
// their outputs, input gradients and the parameters.
func reference(widths []int, plain bool, ms []micro, order []int) (ys, dxs []Matrix, ps []*Param) {
	seq := NewSequential(stageModel(1, widths, plain)...)
	seq.Layers[0].(*Dense).SkipInputGrad = false
	ys, dxs = make([]Matrix, len(ms)), make([]Matrix, len(ms))
	for _, i := range order {
		ys[i] = clone(seq.Forward(ms[i].x))
		dxs[i] = clone(seq.Backward(ms[i].dy, nil))
	}
	return ys, dxs, seq.Params()
}

// TestStageMatchesSequential: a Stage over a model's layers, on slot 0, is
// the Sequential of them bit for bit: output, input gradient, parameter
// gradients and the order ready reports them in; over two steps, so that
// the second reuses every buffer.
func TestStageMatchesSequential(t *testing.T) {
	widths := []int{6, 9, 7, 5}
	for _, tc := range []struct {
		name  string
		opt   StageOptions
		plain bool
		split bool
	}{
		{"first", StageOptions{First: true}, false, false},
		{"middle", StageOptions{}, false, false},
		{"middle-split", StageOptions{}, false, true},
		{"recompute", StageOptions{Recompute: true}, false, false},
		{"first-recompute", StageOptions{Recompute: true, First: true}, false, false},
		{"recompute-split", StageOptions{Recompute: true}, false, true},
		{"plain-layers", StageOptions{}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seq := NewSequential(stageModel(1, widths, tc.plain)...)
			seq.Layers[0].(*Dense).SkipInputGrad = tc.opt.First
			st, err := NewStage(stageModel(1, widths, tc.plain), tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := st.Recomputes(), tc.opt.Recompute || tc.plain; got != want {
				t.Errorf("Recomputes() = %v, want %v", got, want)
			}
			var seqReady, stReady []int
			for step, m := range micros(2, widths, 4, 3) {
				ZeroGrads(seq.Params())
				ZeroGrads(st.Params())
				seqReady, stReady = seqReady[:0], stReady[:0]
				y := seq.Forward(m.x)
				sameMatrix(t, fmt.Sprintf("step %d: output", step), st.Forward(0, m.x), y)
				dx := seq.Backward(m.dy, func(p int) { seqReady = append(seqReady, p) })
				var got Matrix
				if tc.split {
					got = st.BackwardInput(0, m.dy)
					st.BackwardWeight(0, func(p int) { stReady = append(stReady, p) })
				} else {
					got = st.Backward(0, m.dy, func(p int) { stReady = append(stReady, p) })
				}
				if tc.opt.First && (got.Rows != 0 || got.Cols != 0 || got.Data != nil) {
					t.Fatalf("step %d: a first stage's input gradient is %d×%d, want empty", step, got.Rows, got.Cols)
				}
				sameMatrix(t, fmt.Sprintf("step %d: input gradient", step), got, dx)
				sameGrads(t, st.Params(), seq.Params())
				if !slices.Equal(stReady, seqReady) {
					t.Fatalf("step %d: ready reported %v, want %v", step, stReady, seqReady)
				}
			}
		})
	}
}

// stageModes are the ways a Stage runs several micro-batches in flight,
// micro-batch i in slot stageSlots[i].
var stageModes = []struct {
	name  string
	opt   StageOptions
	plain bool // add layers that are not Slotted
	split bool // BackwardInput and BackwardWeight rather than Backward
}{
	{"slots", StageOptions{}, false, false},
	{"slots-split", StageOptions{}, false, true},
	{"recompute", StageOptions{Recompute: true}, false, false},
	{"recompute-split", StageOptions{Recompute: true}, false, true},
	{"plain-layers", StageOptions{}, true, false},
	{"plain-layers-split", StageOptions{}, true, true},
}

// The orders of a mode's ops: 1F1B-like with the backwards scrambled and
// slot 0 reused by micro-batch 3; split, the input gradients' halves in one
// order and the weights' in another, interleaved with other micro-batches.
const (
	backwardOps = "F0 F1 F2 B1 B0 F3 B3 B2"
	splitOps    = "F0 F1 F2 I1 I2 I0 W0 F3 W2 I3 W1 W3"
)

var stageSlots = []int{0, 1, 2, 0}

func modeOps(split bool) []stageOp {
	if split {
		return parseOps(splitOps)
	}
	return parseOps(backwardOps)
}

// runStage runs ops on a fresh Stage, checking each micro-batch's output
// when its backward starts, its input gradient when it is returned and
// again at the end unless its slot ran another backward since, and ready:
// each micro-batch's B or W reports every parameter, last first. It returns
// the outputs, input gradients, the order the gradients were completed in,
// and the parameters.
func runStage(t *testing.T, widths []int, plain bool, opt StageOptions, ms []micro, ops []stageOp) (ys, dxs []Matrix, done []int, ps []*Param) {
	t.Helper()
	st, err := NewStage(stageModel(1, widths, plain), opt)
	if err != nil {
		t.Fatal(err)
	}
	ys, dxs = make([]Matrix, len(ms)), make([]Matrix, len(ms))
	views := make([]Matrix, len(ms)) // the stage's own, not copies
	var ready []int
	want := make([]int, len(st.Params()))
	for i := range want {
		want[i] = len(want) - 1 - i
	}
	reported := func(op stageOp) {
		t.Helper()
		if !slices.Equal(ready, want) {
			t.Fatalf("%c%d: ready reported %v, want %v", op.kind, op.micro, ready, want)
		}
		ready = ready[:0]
	}
	rec := func(p int) { ready = append(ready, p) }
	lastBackward := map[int]int{} // slot: the micro-batch of its last backward
	var scratch []float32
	for _, op := range ops {
		i, s := op.micro, stageSlots[op.micro]
		switch op.kind {
		case 'F':
			if !st.Recomputes() {
				views[i] = st.Forward(s, ms[i].x)
			} else { // the stage keeps its own copy: x may be reused at once
				x := resize(&scratch, ms[i].x.Rows, ms[i].x.Cols)
				copy(x.Data, ms[i].x.Data)
				views[i] = st.Forward(s, x)
				for j := range x.Data {
					x.Data[j] = float32(math.NaN())
				}
			}
			ys[i] = clone(views[i])
		case 'B', 'I':
			sameMatrix(t, fmt.Sprintf("micro-batch %d's output at its backward", i), views[i], ys[i])
			if op.kind == 'B' {
				views[i] = st.Backward(s, ms[i].dy, rec)
				reported(op)
				done = append(done, i)
			} else {
				views[i] = st.BackwardInput(s, ms[i].dy)
				if st.Recomputes() { // the whole backward
					done = append(done, i)
				}
			}
			dxs[i] = clone(views[i])
			lastBackward[s] = i
		case 'W':
			st.BackwardWeight(s, rec)
			reported(op)
			if !st.Recomputes() {
				done = append(done, i)
			}
		}
	}
	for s, i := range lastBackward {
		sameMatrix(t, fmt.Sprintf("slot %d's input gradient at the end", s), views[i], dxs[i])
	}
	return ys, dxs, done, st.Params()
}

// TestStageMicroBatchesInFlight: micro-batches forwarded into different
// slots and backwarded in a scrambled order give the outputs and input
// gradients of each run alone, bit for bit; the parameters' gradients equal
// those of each run alone in micro-batch order within float32 rounding, and
// bit for bit when the reference accumulates them in the stage's order.
func TestStageMicroBatchesInFlight(t *testing.T) {
	widths := []int{6, 9, 7, 5}
	ms := micros(3, widths, 5, 3, 4, 2)
	for _, tc := range stageModes {
		t.Run(tc.name, func(t *testing.T) {
			ys, dxs, done, ps := runStage(t, widths, tc.plain, tc.opt, ms, modeOps(tc.split))
			if len(done) != len(ms) {
				t.Fatalf("%d micro-batches' gradients completed, want %d", len(done), len(ms))
			}
			wantY, wantDX, same := reference(widths, tc.plain, ms, done)
			for i := range ms {
				sameMatrix(t, fmt.Sprintf("micro-batch %d's output", i), ys[i], wantY[i])
				sameMatrix(t, fmt.Sprintf("micro-batch %d's input gradient", i), dxs[i], wantDX[i])
			}
			sameGrads(t, ps, same)
			_, _, inOrder := reference(widths, tc.plain, ms, []int{0, 1, 2, 3})
			for k, p := range ps {
				want := inOrder[k].Grad
				var scale float64
				for _, g := range want {
					scale = max(scale, math.Abs(float64(g)))
				}
				for j, g := range p.Grad {
					if d := math.Abs(float64(g) - float64(want[j])); d > 1e-6*scale {
						t.Fatalf("%s.Grad[%d] = %v, in micro-batch order %v", p.Name, j, g, want[j])
					}
				}
			}
		})
	}
}

// TestStageRecomputeBitwise: recomputation changes nothing, bit for bit,
// for the same order of backwards. (Recomputing, BackwardInput is the whole
// backward: split, the weights' halves must run in the input halves' order.)
func TestStageRecomputeBitwise(t *testing.T) {
	widths := []int{6, 9, 9, 7, 5}
	ms := micros(4, widths, 5, 3, 4, 2)
	for _, ops := range []string{backwardOps, "F0 F1 F2 I1 I2 W1 I0 W2 W0 F3 I3 W3"} {
		t.Run(ops, func(t *testing.T) {
			y0, dx0, done0, p0 := runStage(t, widths, false, StageOptions{}, ms, parseOps(ops))
			y1, dx1, done1, p1 := runStage(t, widths, false, StageOptions{Recompute: true}, ms, parseOps(ops))
			if !slices.Equal(done0, done1) {
				t.Fatalf("gradients completed in order %v, recomputing %v", done0, done1)
			}
			for i := range ms {
				sameMatrix(t, fmt.Sprintf("micro-batch %d's output", i), y1[i], y0[i])
				sameMatrix(t, fmt.Sprintf("micro-batch %d's input gradient", i), dx1[i], dx0[i])
			}
			sameGrads(t, p1, p0)
		})
	}
}

// TestStageSplitIsBackward: BackwardInput then, later and interleaved with
// other slots' work, BackwardWeight, gives Backward's gradients bit for bit
// when the weights' halves run in the same order.
func TestStageSplitIsBackward(t *testing.T) {
	widths := []int{6, 9, 7, 5}
	ms := micros(5, widths, 5, 3, 4, 2)
	for _, opt := range []StageOptions{{}, {First: true}} {
		t.Run(fmt.Sprintf("first=%v", opt.First), func(t *testing.T) {
			_, dx0, done0, p0 := runStage(t, widths, false, opt, ms, parseOps("F0 F1 F2 B0 F3 B2 B1 B3"))
			_, dx1, done1, p1 := runStage(t, widths, false, opt, ms, parseOps("F0 F1 F2 I1 I0 W0 F3 I2 I3 W2 W1 W3"))
			if !slices.Equal(done0, done1) {
				t.Fatalf("completed in order %v and %v", done0, done1)
			}
			for i := range ms {
				sameMatrix(t, fmt.Sprintf("micro-batch %d's input gradient", i), dx1[i], dx0[i])
			}
			sameGrads(t, p1, p0)
		})
	}
}

// TestStageAllocatesNothing: once every slot's buffers exist, a round of
// four micro-batches, forwards and backwards, allocates nothing. The shapes
// are small enough for gonum's Sgemm to run on the calling goroutine.
func TestStageAllocatesNothing(t *testing.T) {
	widths := []int{16, 32, 32, 8}
	ms := micros(6, widths, 8, 8, 6, 8)
	for _, tc := range stageModes {
		t.Run(tc.name, func(t *testing.T) {
			st, err := NewStage(stageModel(1, widths, tc.plain), tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			var n int
			ready := func(int) { n++ }
			round := func() {
				for s, m := range ms {
					st.Forward(s, m.x)
				}
				for s, m := range ms {
					if tc.split {
						st.BackwardInput(s, m.dy)
					} else {
						st.Backward(s, m.dy, ready)
					}
				}
				if tc.split {
					for s := range ms {
						st.BackwardWeight(s, ready)
					}
				}
			}
			round()
			if allocs := testing.AllocsPerRun(10, round); allocs != 0 {
				t.Errorf("%v allocations per round, want 0", allocs)
			}
			if want := 12 * len(ms) * len(st.Params()); n != want {
				t.Errorf("ready called %d times, want %d", n, want)
			}
		})
	}
}

// TestStageActivationBytes: without recomputation the caches grow by one
// slot's activations per micro-batch in flight; with it they stay at one
// slot's plus each micro-batch's kept input, output and input gradient,
// less for a deep stage.
func TestStageActivationBytes(t *testing.T) {
	const rows = 16
	widths := []int{24, 32, 32, 32, 32, 32, 32, 32, 20}
	x, dy := randMatrix(rand.New(rand.NewPCG(7, 7)), rows, widths[0]), randMatrix(rand.New(rand.NewPCG(7, 8)), rows, widths[len(widths)-1])
	bytes := func(o StageOptions, slots int) int64 {
		st, err := NewStage(stageModel(1, widths, false), o)
		if err != nil {
			t.Fatal(err)
		}
		if st.ActivationBytes() != 0 {
			t.Fatalf("%d bytes before any forward", st.ActivationBytes())
		}
		for s := range slots {
			st.Forward(s, x)
		}
		for s := range slots {
			st.Backward(s, dy, nil)
		}
		return st.ActivationBytes()
	}
	one := bytes(StageOptions{}, 1)
	// Per layer, the output and the input gradient.
	var want int64
	for i := 0; i+1 < len(widths); i++ {
		want += 4 * rows * int64(widths[i]+widths[i+1]) // Dense
		switch {
		case i == 1: // LayerNorm (normalised input, output, input gradient, a deviation a row), GELU (tanh, output, input gradient)
			want += 4*rows*(3*int64(widths[i])+1) + 4*rows*3*int64(widths[i])
		case i > 0:
			want += 4 * rows * 2 * int64(widths[i]) // ReLU
		}
	}
	if one != want {
		t.Fatalf("one slot: %d bytes, want %d", one, want)
	}
	for slots := 2; slots <= 4; slots++ {
		if got := bytes(StageOptions{}, slots); got != int64(slots)*one {
			t.Errorf("%d slots: %d bytes, want %d", slots, got, int64(slots)*one)
		}
	}
	kept := 4 * rows * int64(2*widths[0]+widths[len(widths)-1])
	for slots := 1; slots <= 4; slots++ {
		if got := bytes(StageOptions{Recompute: true}, slots); got != one+int64(slots)*kept {
			t.Errorf("recomputing, %d slots: %d bytes, want %d", slots, got, one+int64(slots)*kept)
		}
	}
	if rec, all := bytes(StageOptions{Recompute: true}, 4), bytes(StageOptions{}, 4); rec >= all {
		t.Errorf("4 slots: %d bytes recomputing, not less than %d without", rec, all)
	}
}

func TestNewStageRejectsNoLayers(t *testing.T) {
	if _, err := NewStage(nil, StageOptions{}); err == nil {
		t.Error("a stage of no layers made")
	}
	if _, err := NewStage([]Layer{&ReLU{}, nil}, StageOptions{}); err == nil {
		t.Error("a stage with a nil layer made")
	}
}

// TestDenseBackwardWeightOnce: a second BackwardWeight of a slot adds
// nothing, and Backward is BackwardInput then BackwardWeight.
func TestDenseBackwardWeightOnce(t *testing.T) {
	widths := []int{6, 4}
	m := micros(8, widths, 3)[0]
	split, whole := stageModel(1, widths, false)[0].(*Dense), stageModel(1, widths, false)[0].(*Dense)
	split.UseSlot(2)
	split.Forward(m.x)
	whole.Forward(m.x)
	sameMatrix(t, "input gradient", split.BackwardInput(m.dy), whole.Backward(m.dy))
	split.BackwardWeight()
	split.BackwardWeight()
	sameGrads(t, split.Params(), whole.Params())
}
