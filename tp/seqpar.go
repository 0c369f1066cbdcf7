package tp

import (
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// Sequence parallelism, as Megatron-LM's: in the regions a
// tensor-parallel block does not split (its LayerNorms, the residual
// stream), each rank holds a range of the rows (tokens) instead of all of
// them, so those activations take 1/T of the memory. A block's all-reduces
// become pairs: an all-gather of the rows into the column-parallel layer
// (its backward a reduce-scatter, which replaces f's all-reduce), and a
// reduce-scatter of the row-parallel layer's partial sums back to rows
// (its backward an all-gather, g's identity spread out). Parameters that
// then see only a rank's rows (the LayerNorms, the row-parallel biases)
// have partial gradients: SyncGrads sums them across the group after the
// backward.

// rowCuts are the offsets of every rank's rows of a rows × cols matrix
// laid out row-major: collective.ShardRange of the rows.
func rowCuts(cuts *[]int, rows, cols, size int) []int {
	c := (*cuts)[:0]
	for r := range size {
		lo, _ := collective.ShardRange(rows, size, r)
		c = append(c, lo*cols)
	}
	*cuts = append(c, rows*cols)
	return *cuts
}

// RowsOf is the range of a group's rows this rank holds under sequence
// parallelism.
func (c *Comm) RowsOf(rows int) (lo, hi int) {
	return collective.ShardRange(rows, c.Size(), c.Rank())
}

// allGatherRows makes every rank's rows whole on every rank: local is
// this rank's rows, the result rows × cols in *into.
func (c *Comm) allGatherRows(what string, local nn.Matrix, rows int, into *[]float32, cuts *[]int) nn.Matrix {
	out := nn.Matrix{Rows: rows, Cols: local.Cols, Data: grow(into, rows*local.Cols)}
	if c.err != nil {
		clear(out.Data)
		return out
	}
	cs := rowCuts(cuts, rows, local.Cols, c.Size())
	copy(out.Data[cs[c.Rank()]:cs[c.Rank()+1]], local.Data)
	if c.alone() {
		return out
	}
	t0 := c.now()
	defer func() { c.spent += c.now().Sub(t0) }()
	if err := c.G.AllGatherRanges(c.ctx, collective.Float32s(out.Data), cs); err != nil {
		c.fail(what, err)
		clear(out.Data)
	}
	return out
}

// reduceScatterRows sums whole-shaped partial matrices across the group
// and keeps this rank's rows of the sum in *into.
func (c *Comm) reduceScatterRows(what string, partial nn.Matrix, into *[]float32, cuts *[]int) nn.Matrix {
	lo, hi := c.RowsOf(partial.Rows)
	out := nn.Matrix{Rows: hi - lo, Cols: partial.Cols, Data: grow(into, (hi-lo)*partial.Cols)}
	if c.err != nil {
		clear(out.Data)
		return out
	}
	cs := rowCuts(cuts, partial.Rows, partial.Cols, c.Size())
	if c.alone() {
		copy(out.Data, partial.Data)
		return out
	}
	t0 := c.now()
	defer func() { c.spent += c.now().Sub(t0) }()
	if err := c.G.ReduceScatterRanges(c.ctx, collective.Float32s(partial.Data), cs, collective.Float32s(out.Data), collective.Sum); err != nil {
		c.fail(what, err)
		clear(out.Data)
	}
	return out
}

// SeqSplit enters the sequence-parallel region: its input is every row
// (replicated), its output this rank's rows; its backward all-gathers the
// rows' gradients, so that the layer before sees all of them.
type SeqSplit struct {
	comm  *Comm
	rows  int
	y, dx []float32
	cuts  []int
}

// NewSeqSplit enters the sequence-parallel region of comm's group.
func NewSeqSplit(comm *Comm) *SeqSplit { return &SeqSplit{comm: comm} }

func (s *SeqSplit) Params() []*nn.Param { return nil }

func (s *SeqSplit) Forward(x nn.Matrix) nn.Matrix {
	lo, hi := s.comm.RowsOf(x.Rows)
	s.rows, s.comm.seqRows = x.Rows, x.Rows
	y := nn.Matrix{Rows: hi - lo, Cols: x.Cols, Data: grow(&s.y, (hi-lo)*x.Cols)}
	copy(y.Data, x.Data[lo*x.Cols:hi*x.Cols])
	return y
}

func (s *SeqSplit) Backward(dy nn.Matrix) nn.Matrix {
	return s.comm.allGatherRows("sequence-parallel split's gradient", dy, s.rows, &s.dx, &s.cuts)
}

// SeqGather leaves the sequence-parallel region into a column-parallel
// layer: its forward all-gathers the rows, its backward reduce-scatters
// the whole-shaped partial input gradients of the column-parallel layer
// (built with SeqParallel, which then skips f's all-reduce) to this
// rank's rows.
type SeqGather struct {
	comm  *Comm
	y, dx []float32
	cuts  []int
}

// NewSeqGather gathers the rows of comm's group.
func NewSeqGather(comm *Comm) *SeqGather { return &SeqGather{comm: comm} }

func (s *SeqGather) Params() []*nn.Param { return nil }

// Forward takes this rank's rows of the rows the group's SeqSplit
// split last.
func (s *SeqGather) Forward(x nn.Matrix) nn.Matrix {
	return s.comm.allGatherRows("sequence-parallel gather", x, s.comm.seqRows, &s.y, &s.cuts)
}

func (s *SeqGather) Backward(dy nn.Matrix) nn.Matrix {
	return s.comm.reduceScatterRows("sequence-parallel gather's gradient", dy, &s.dx, &s.cuts)
}

// SeqScatter enters the sequence-parallel region from a row-parallel
// layer (built with SeqParallel: its partial sums not all-reduced, its
// bias not added): it reduce-scatters the partial sums to this rank's
// rows and adds the bias B there. Its backward adds this rank's rows'
// share of B's gradient (SyncGrads sums the shares) and all-gathers the
// rows' gradients for the row-parallel layer.
type SeqScatter struct {
	B     *nn.Param
	comm  *Comm
	rows  int
	y, dx []float32
	cuts  []int
}

// NewSeqScatter reduce-scatters into comm's group's rows and adds b.
func NewSeqScatter(comm *Comm, b *nn.Param) *SeqScatter { return &SeqScatter{B: b, comm: comm} }

func (s *SeqScatter) Params() []*nn.Param { return []*nn.Param{s.B} }

func (s *SeqScatter) Forward(x nn.Matrix) nn.Matrix {
	s.rows = x.Rows
	y := s.comm.reduceScatterRows("sequence-parallel scatter", x, &s.y, &s.cuts)
	for r := range y.Rows {
		row := y.Data[r*y.Cols : (r+1)*y.Cols]
		for j, b := range s.B.Value {
			row[j] += b
		}
	}
	return y
}

func (s *SeqScatter) Backward(dy nn.Matrix) nn.Matrix {
	for r := range dy.Rows {
		for j, g := range dy.Data[r*dy.Cols : (r+1)*dy.Cols] {
			s.B.Grad[j] += g
		}
	}
	return s.comm.allGatherRows("sequence-parallel scatter's gradient", dy, s.rows, &s.dx, &s.cuts)
}

// SyncGrads sums the gradients of params across the group, in place: the
// parameters a sequence-parallel region holds whole while each rank sees
// only its rows (CutBlockSequenceParallel's second result).
func (c *Comm) SyncGrads(params []*nn.Param) {
	for _, p := range params {
		c.allReduce("sequence-parallel gradient", p.Grad)
	}
}
