// Package tp is tensor-parallel layers in Megatron-LM's manner: one
// matrix product cut across the ranks of a collective group. A
// ColumnParallel layer holds a range of the weight's columns: its input is
// replicated and its output split by columns (or gathered whole). A
// RowParallel layer holds a range of the weight's rows: its input is split
// by columns, and the partial products are summed. Between them sit
// Megatron's conjugate operators: f (identity forward, all-reduce of the
// input gradient backward) at a ColumnParallel's input, and g (all-reduce
// forward, identity backward) at a RowParallel's output.
//
// The layers are nn.Layers, whose Forward and Backward return no error:
// their collectives run under the context of their Comm, set for each
// step, and the first failure is kept there (Comm.Err) for the caller to
// check after the step; a failed layer passes zeros on.
package tp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/dtensor"
	"github.com/phalanx-rt/phalanx/nn"
)

// Comm is a tensor-parallel group as the layers use it: the group, the
// context their collectives run under (Step sets it), and the first
// failure since. Its size and rank are fixed when it is made; the group
// itself may be replaced (Use) by another of the same shape, as a job
// forms a new one each generation while a rank keeps its place.
type Comm struct {
	G          *collective.Group
	size, rank int
	ctx        context.Context
	err        error
	seqRows    int // the rows the last SeqSplit split
	// Now is the clock the time in collectives is measured by (nil:
	// time.Now).
	Now   func() time.Time
	spent time.Duration
}

func (c *Comm) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Spent is the time the layers have spent in their collectives so far.
func (c *Comm) Spent() time.Duration { return c.spent }

// NewComm makes g's Comm, its collectives under ctx until Step.
func NewComm(ctx context.Context, g *collective.Group) *Comm {
	return &Comm{G: g, size: g.Size(), rank: g.Rank(), ctx: ctx}
}

// NewCommAt makes the Comm of rank of a group of size ranks, to build
// layers with before the group exists (Use gives it).
func NewCommAt(size, rank int) (*Comm, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("tp: rank %d of a tensor-parallel group of %d", rank, size)
	}
	return &Comm{size: size, rank: rank, ctx: context.Background()}, nil
}

// Use makes the layers' collectives run on g, under ctx, from now on, and
// forgets an earlier failure: g must have the Comm's size, and its rank.
func (c *Comm) Use(ctx context.Context, g *collective.Group) error {
	if g.Size() != c.size || g.Rank() != c.rank {
		return fmt.Errorf("tp: a group where this rank is %d of %d, for layers built as rank %d of %d", g.Rank(), g.Size(), c.rank, c.size)
	}
	c.G, c.ctx, c.err = g, ctx, nil
	return nil
}

// alone: a group of one rank with no group given (NewCommAt(1, 0)):
// every collective is the identity.
func (c *Comm) alone() bool { return c.G == nil && c.size == 1 }

// Size is the group's size.
func (c *Comm) Size() int { return c.size }

// Rank is this rank's place in the group.
func (c *Comm) Rank() int { return c.rank }

// Step sets the context of the layers' collectives for a step.
func (c *Comm) Step(ctx context.Context) { c.ctx = ctx }

// Err is the first failure of a layer's collective (nil: none).
func (c *Comm) Err() error { return c.err }

func (c *Comm) fail(what string, err error) {
	if c.err == nil {
		c.err = fmt.Errorf("tensor parallel %s: %w", what, err)
	}
}

// allReduce sums x across the group, in place (f's backward, g's forward).
func (c *Comm) allReduce(what string, x []float32) {
	if c.err != nil {
		clear(x)
		return
	}
	if c.alone() {
		return
	}
	t0 := c.now()
	defer func() { c.spent += c.now().Sub(t0) }()
	if err := c.G.AllReduce(c.ctx, collective.Float32s(x), collective.Sum); err != nil {
		c.fail(what, err)
		clear(x)
	}
}

// gatherColumns makes the rows × cols matrix whose columns each rank
// holds a range of (its local part m) whole on every rank.
func (c *Comm) gatherColumns(what string, m nn.Matrix, cols int, into *[]float32) nn.Matrix {
	out := nn.Matrix{Rows: m.Rows, Cols: cols, Data: grow(into, m.Rows*cols)}
	if c.err != nil {
		clear(out.Data)
		return out
	}
	if c.alone() {
		copy(out.Data, m.Data)
		return out
	}
	t0 := c.now()
	defer func() { c.spent += c.now().Sub(t0) }()
	t := &dtensor.Tensor{Shape: []int{m.Rows, cols}, Place: dtensor.Split(1), Local: m.Data, G: c.G}
	whole, err := dtensor.Redistribute(c.ctx, t, dtensor.Replicate())
	if err != nil {
		c.fail(what, err)
		clear(out.Data)
		return out
	}
	copy(out.Data, whole.Local)
	return out
}

// columns copies columns [lo, hi) of m into *into.
func columns(m nn.Matrix, lo, hi int, into *[]float32) nn.Matrix {
	w := hi - lo
	out := nn.Matrix{Rows: m.Rows, Cols: w, Data: grow(into, m.Rows*w)}
	for r := range m.Rows {
		copy(out.Data[r*w:(r+1)*w], m.Data[r*m.Cols+lo:r*m.Cols+hi])
	}
	return out
}

// emptyDense is a Dense of in × out named as full, its values to be
// copied in.
func emptyDense(full *nn.Dense, in, out int) *nn.Dense {
	d := nn.NewDense("", in, out, rand.New(rand.NewPCG(0, 0)))
	d.W.Name, d.B.Name = full.W.Name, full.B.Name
	clear(d.W.Value)
	return d
}

func grow(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	*b = (*b)[:n]
	return *b
}

// ColumnParallel is y = x·W + b with W's columns [lo, hi) (and b's) on
// this rank: the input replicated, the output this rank's columns, or
// every column when Gather. A layer cut in blocks (NewColumnParallelBlocks)
// holds its range of each block instead, side by side.
type ColumnParallel struct {
	Local  *nn.Dense // W[:, lo:hi], b[lo:hi]
	Gather bool
	// SeqParallel: the input comes through a SeqGather, whose backward
	// reduce-scatters the input gradient, so f's all-reduce is skipped.
	SeqParallel bool
	comm        *Comm
	out         int
	lo, hi      int
	blocks      int
	y, dy       []float32
}

// NewColumnParallel cuts full (the same on every rank) by columns: this
// rank keeps its range (collective.ShardRange of the outputs).
func NewColumnParallel(comm *Comm, full *nn.Dense, gather bool) *ColumnParallel {
	l, _ := cutColumns(comm, full, 1)
	l.Gather = gather
	return l
}

// NewColumnParallelBlocks cuts full's outputs into blocks equal blocks and
// keeps this rank's range of each (collective.ShardRange of a block), side
// by side: for attention's [Q | K | V] projection, blocks = 3, and with
// the group dividing the heads each rank gets the queries, keys and
// values of its own heads, in the layout nn.CausalAttention reads. Its
// output stays split.
func NewColumnParallelBlocks(comm *Comm, full *nn.Dense, blocks int) (*ColumnParallel, error) {
	return cutColumns(comm, full, blocks)
}

func cutColumns(comm *Comm, full *nn.Dense, blocks int) (*ColumnParallel, error) {
	in, out := full.W.Shape[0], full.W.Shape[1]
	if blocks < 1 || out%blocks != 0 {
		return nil, fmt.Errorf("tp: %s: %d outputs do not cut into %d blocks", full.W.Name, out, blocks)
	}
	bw := out / blocks
	lo, hi := collective.ShardRange(bw, comm.Size(), comm.Rank())
	w := hi - lo
	local := emptyDense(full, in, blocks*w)
	for b := range blocks {
		at := b*bw + lo
		for r := range in {
			copy(local.W.Value[r*blocks*w+b*w:r*blocks*w+(b+1)*w], full.W.Value[r*out+at:r*out+at+w])
		}
		copy(local.B.Value[b*w:(b+1)*w], full.B.Value[at:at+w])
	}
	return &ColumnParallel{Local: local, comm: comm, out: out, lo: lo, hi: hi, blocks: blocks}, nil
}

// Range is the columns this rank holds (of each block).
func (l *ColumnParallel) Range() (lo, hi int) { return l.lo, l.hi }

// Blocks is how many blocks the outputs are cut in (1: one range).
func (l *ColumnParallel) Blocks() int { return l.blocks }

func (l *ColumnParallel) Params() []*nn.Param { return l.Local.Params() }

func (l *ColumnParallel) Forward(x nn.Matrix) nn.Matrix { // f: identity
	y := l.Local.Forward(x)
	if !l.Gather || l.blocks > 1 {
		return y
	}
	return l.comm.gatherColumns("column-parallel output", y, l.out, &l.y)
}

func (l *ColumnParallel) Backward(dy nn.Matrix) nn.Matrix {
	if l.Gather && l.blocks == 1 {
		dy = columns(dy, l.lo, l.hi, &l.dy)
	}
	dx := l.Local.Backward(dy)
	if !l.SeqParallel {
		l.comm.allReduce("column-parallel input gradient", dx.Data) // f's backward
	}
	return dx
}

// RowParallel is y = x·W + b with W's rows [lo, hi) on this rank: the
// input this rank's columns [lo, hi) (SplitInput), or replicated and cut
// here; the partial products summed across the group (g), then b, which
// every rank holds whole.
type RowParallel struct {
	Local      *nn.Dense // W[lo:hi, :]; its own bias stays zero
	B          *nn.Param
	SplitInput bool
	// SeqParallel: the partial sums go to a SeqScatter, which
	// reduce-scatters them and adds B (its parameter then, not this
	// layer's).
	SeqParallel bool
	comm        *Comm
	in          int
	lo, hi      int
	x, dx       []float32
}

// NewRowParallel cuts full (the same on every rank) by rows: this rank
// keeps its range (collective.ShardRange of the inputs).
func NewRowParallel(comm *Comm, full *nn.Dense, splitInput bool) *RowParallel {
	in, out := full.W.Shape[0], full.W.Shape[1]
	lo, hi := collective.ShardRange(in, comm.Size(), comm.Rank())
	local := emptyDense(full, hi-lo, out)
	copy(local.W.Value, full.W.Value[lo*out:hi*out])
	b := nn.NewParam(full.B.Name, out)
	copy(b.Value, full.B.Value)
	return &RowParallel{Local: local, B: b, SplitInput: splitInput, comm: comm, in: in, lo: lo, hi: hi}
}

// Range is the rows (the inputs) this rank holds.
func (l *RowParallel) Range() (lo, hi int) { return l.lo, l.hi }

func (l *RowParallel) Params() []*nn.Param {
	if l.SeqParallel {
		return []*nn.Param{l.Local.W}
	}
	return []*nn.Param{l.Local.W, l.B}
}

func (l *RowParallel) Forward(x nn.Matrix) nn.Matrix {
	if !l.SplitInput {
		x = columns(x, l.lo, l.hi, &l.x)
	}
	z := l.Local.Forward(x)
	if l.SeqParallel {
		return z
	}
	l.comm.allReduce("row-parallel output", z.Data) // g
	for r := range z.Rows {
		row := z.Data[r*z.Cols : (r+1)*z.Cols]
		for j, b := range l.B.Value {
			row[j] += b
		}
	}
	return z
}

func (l *RowParallel) Backward(dz nn.Matrix) nn.Matrix { // g's backward: identity
	if !l.SeqParallel { // else B and its gradient are the SeqScatter's
		for r := range dz.Rows {
			for j, g := range dz.Data[r*dz.Cols : (r+1)*dz.Cols] {
				l.B.Grad[j] += g
			}
		}
	}
	dx := l.Local.Backward(dz)
	clear(l.Local.B.Grad) // the local bias is not a parameter: B is
	if l.SplitInput {
		return dx
	}
	return l.comm.gatherColumns("row-parallel input gradient", dx, l.in, &l.dx)
}
