package nn

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// Layer is one stage of a Sequential model. Forward keeps what Backward
// needs; Backward adds the parameters' gradients into their Grad and returns
// the gradient of the input. The returned matrices are the layer's own buffers,
// valid until its next call (of a Slotted layer: the same slot's next call).
type Layer interface {
	Forward(x Matrix) Matrix
	Backward(dy Matrix) Matrix
	Params() []*Param
}

// Dense is y = x·W + b with W of shape [in, out]. It is Slotted and a
// Splitter.
type Dense struct {
	W, B *Param
	// SkipInputGrad leaves Backward's result empty: the first layer of a model
	// has no one to pass it to.
	SkipInputGrad bool

	slots   []denseCache
	slot    int
	in, out int
}

// denseCache is what one forward pass of a Dense keeps for its backward,
// and the buffers it returns.
type denseCache struct {
	x     Matrix // the input, the caller's: valid until the backward
	dy    Matrix // BackwardInput's, the caller's: valid until BackwardWeight
	y, dx []float32
}

// NewDense makes a Dense layer with He-uniform weights drawn from rng and zero
// bias.
func NewDense(name string, in, out int, rng *rand.Rand) *Dense {
	d := &Dense{W: NewParam(name+".W", in, out), B: NewParam(name+".b", out), in: in, out: out}
	bound := math.Sqrt(6 / float64(in))
	for i := range d.W.Value {
		d.W.Value[i] = float32((rng.Float64()*2 - 1) * bound)
	}
	return d
}

func (d *Dense) Params() []*Param { return []*Param{d.W, d.B} }

// UseSlot makes the following calls use cache slot i (see Slotted).
func (d *Dense) UseSlot(i int) { useSlot(&d.slots, &d.slot, i) }

// ActivationBytes is the size of the buffers of every slot allocated so far.
func (d *Dense) ActivationBytes() int64 {
	var n int
	for _, c := range d.slots {
		n += cap(c.y) + cap(c.dx)
	}
	return 4 * int64(n)
}

func (d *Dense) cache() *denseCache { return slotOf(&d.slots, d.slot) }

func (d *Dense) weights() blas32.General {
	return blas32.General{Rows: d.in, Cols: d.out, Stride: d.out, Data: d.W.Value}
}

func general(m Matrix) blas32.General {
	return blas32.General{Rows: m.Rows, Cols: m.Cols, Stride: max(m.Cols, 1), Data: m.Data}
}

func (d *Dense) Forward(x Matrix) Matrix {
	if x.Cols != d.in {
		panic(fmt.Sprintf("nn: %s takes %d inputs, got %d", d.W.Name, d.in, x.Cols))
	}
	c := d.cache()
	c.x = x
	y := resize(&c.y, x.Rows, d.out)
	for i := range y.Rows {
		copy(y.Row(i), d.B.Value)
	}
	if x.Rows > 0 {
		gemm(blas.NoTrans, blas.NoTrans, 1, general(x), d.weights(), 1, general(y))
	}
	return y
}

func (d *Dense) Backward(dy Matrix) Matrix {
	c := d.cache()
	if dy.Rows == 0 {
		return resize(&c.dx, 0, d.in)
	}
	d.weightGrads(c.x, dy)
	return d.inputGrad(c, dy)
}

// BackwardInput is the input-gradient half of Backward (see Splitter); it
// keeps dy, which must stay valid until the slot's BackwardWeight.
func (d *Dense) BackwardInput(dy Matrix) Matrix {
	c := d.cache()
	c.dy = dy
	if dy.Rows == 0 {
		return resize(&c.dx, 0, d.in)
	}
	return d.inputGrad(c, dy)
}

// BackwardWeight adds W's and b's gradients of the slot's last
// BackwardInput, once: a second call adds nothing.
func (d *Dense) BackwardWeight() {
	c := d.cache()
	if c.dy.Rows > 0 {
		d.weightGrads(c.x, c.dy)
	}
	c.dy = Matrix{}
}

// weightGrads adds xᵀ·dy into W's gradient and dy's column sums into b's.
func (d *Dense) weightGrads(x, dy Matrix) {
	gemm(blas.Trans, blas.NoTrans, 1, general(x), general(dy), 1,
		blas32.General{Rows: d.in, Cols: d.out, Stride: d.out, Data: d.W.Grad})
	g := d.B.Grad[:dy.Cols]
	for i := range dy.Rows {
		row := dy.Row(i)[:len(g)]
		for j, v := range row {
			g[j] += v
		}
	}
}

// inputGrad is dy·Wᵀ into c's dx, or nothing when SkipInputGrad.
func (d *Dense) inputGrad(c *denseCache, dy Matrix) Matrix {
	if d.SkipInputGrad {
		return Matrix{}
	}
	dx := resize(&c.dx, dy.Rows, d.in)
	gemm(blas.NoTrans, blas.Trans, 1, general(dy), d.weights(), 0, general(dx))
	return dx
}

// ReLU is max(x, 0), element-wise. It is Slotted; its zero value is ready.
type ReLU struct {
	slots []reluCache
	slot  int
}

// reluCache is one forward pass's output (what the backward needs) and the
// input gradient's buffer.
type reluCache struct {
	y, dx []float32
}

func (r *ReLU) Params() []*Param { return nil }

// UseSlot makes the following calls use cache slot i (see Slotted).
func (r *ReLU) UseSlot(i int) { useSlot(&r.slots, &r.slot, i) }

// ActivationBytes is the size of the buffers of every slot allocated so far.
func (r *ReLU) ActivationBytes() int64 {
	var n int
	for _, c := range r.slots {
		n += cap(c.y) + cap(c.dx)
	}
	return 4 * int64(n)
}

func (r *ReLU) Forward(x Matrix) Matrix {
	c := slotOf(&r.slots, r.slot)
	y := resize(&c.y, x.Rows, x.Cols)
	for i, v := range x.Data {
		y.Data[i] = max(v, 0)
	}
	return y
}

func (r *ReLU) Backward(dy Matrix) Matrix {
	c := slotOf(&r.slots, r.slot)
	dx := resize(&c.dx, dy.Rows, dy.Cols)
	y, out := c.y[:len(dy.Data)], dx.Data[:len(dy.Data)]
	for i, v := range dy.Data {
		// A mask rather than a branch: the sign of an activation is a coin
		// toss the branch predictor loses half the time.
		var keep uint32
		if y[i] > 0 {
			keep = math.MaxUint32
		}
		out[i] = math.Float32frombits(math.Float32bits(v) & keep)
	}
	return dx
}

// Embedding maps integer ids to rows of a [vocab, dim] table.
type Embedding struct {
	Table *Param
	vocab int
	dim   int
	ids   []int32
	y     []float32
}

// NewEmbedding makes a table with N(0, 1/dim) entries drawn from rng.
func NewEmbedding(name string, vocab, dim int, rng *rand.Rand) *Embedding {
	e := &Embedding{Table: NewParam(name+".table", vocab, dim), vocab: vocab, dim: dim}
	s := 1 / math.Sqrt(float64(dim))
	for i := range e.Table.Value {
		e.Table.Value[i] = float32(rng.NormFloat64() * s)
	}
	return e
}

func (e *Embedding) Params() []*Param { return []*Param{e.Table} }

// Lookup returns one row per id; an id outside the vocabulary is an error.
func (e *Embedding) Lookup(ids []int32) (Matrix, error) {
	y := resize(&e.y, len(ids), e.dim)
	for i, id := range ids {
		if id < 0 || int(id) >= e.vocab {
			return Matrix{}, fmt.Errorf("nn: %s: id %d at position %d outside vocabulary of %d", e.Table.Name, id, i, e.vocab)
		}
		copy(y.Row(i), e.Table.Value[int(id)*e.dim:(int(id)+1)*e.dim])
	}
	e.ids = ids
	return y, nil
}

// Backward adds dy's rows into the rows of the looked-up ids.
func (e *Embedding) Backward(dy Matrix) {
	for i, id := range e.ids {
		g := e.Table.Grad[int(id)*e.dim : (int(id)+1)*e.dim]
		for j, v := range dy.Row(i) {
			g[j] += v
		}
	}
}

// SoftmaxCrossEntropy is the classification loss over logits.
type SoftmaxCrossEntropy struct {
	d []float32
}

// Loss returns the summed cross-entropy of the rows of logits against labels,
// the number of rows whose largest logit is the label, and the gradient of
// scale × that sum with respect to the logits.
func (s *SoftmaxCrossEntropy) Loss(logits Matrix, labels []int32, scale float32) (sum float64, correct int, grad Matrix, err error) {
	if len(labels) != logits.Rows {
		return 0, 0, Matrix{}, fmt.Errorf("nn: %d labels for %d rows", len(labels), logits.Rows)
	}
	grad = resize(&s.d, logits.Rows, logits.Cols)
	for i, label := range labels {
		if label < 0 || int(label) >= logits.Cols {
			return 0, 0, Matrix{}, fmt.Errorf("nn: label %d of row %d outside %d classes", label, i, logits.Cols)
		}
		z, g := logits.Row(i), grad.Row(i)
		best := 0
		for j, v := range z {
			if v > z[best] {
				best = j
			}
		}
		if best == int(label) {
			correct++
		}
		zmax := float64(z[best])
		var total float64
		for j, v := range z {
			e := Exp32(v - z[best])
			g[j] = e
			total += float64(e)
		}
		sum += math.Log(total) + zmax - float64(z[label])
		for j := range g {
			g[j] = float32(float64(g[j])/total) * scale
		}
		g[label] -= scale
	}
	return sum, correct, grad, nil
}

// Sequential runs layers in order.
type Sequential struct {
	Layers []Layer
	params []*Param
	counts []int // len(Layers[i].Params()), which Backward needs without allocating
}

// NewSequential chains layers; a leading Dense skips its input gradient.
func NewSequential(layers ...Layer) *Sequential {
	s := &Sequential{Layers: layers}
	if d, ok := layers[0].(*Dense); ok {
		d.SkipInputGrad = true
	}
	for _, l := range layers {
		ps := l.Params()
		s.params = append(s.params, ps...)
		s.counts = append(s.counts, len(ps))
	}
	return s
}

// Params lists every layer's parameters, in layer order.
func (s *Sequential) Params() []*Param { return s.params }

func (s *Sequential) Forward(x Matrix) Matrix {
	for _, l := range s.Layers {
		x = l.Forward(x)
	}
	return x
}

// Backward runs the layers backwards. When ready is not nil it is called with
// the index (in Params order) of each parameter whose gradient is complete, as
// soon as it is, so its allreduce can start while earlier layers still run.
func (s *Sequential) Backward(dy Matrix, ready func(param int)) Matrix {
	end := len(s.params)
	for i := len(s.Layers) - 1; i >= 0; i-- {
		dy = s.Layers[i].Backward(dy)
		n := s.counts[i]
		if ready != nil {
			for p := end - 1; p >= end-n; p-- {
				ready(p)
			}
		}
		end -= n
	}
	return dy
}
