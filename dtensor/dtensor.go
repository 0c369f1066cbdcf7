// Package dtensor is a distributed tensor: a logical row-major float32
// tensor that lives on a collective group in one of three placements, as
// OneFlow's SBP signatures and PyTorch's DTensor name them:
//
//   - Split(axis): each rank holds a contiguous range of the axis
//     (collective.ShardRange of its length: sizes may differ by one);
//   - Replicate (OneFlow's broadcast): every rank holds the whole tensor;
//   - Partial (sum): every rank holds a whole-shaped tensor, and the
//     logical tensor is their element-wise sum.
//
// Redistribute converts between any two placements on the cheapest
// collective: split → replicate an all-gather, partial → split a
// reduce-scatter, partial → replicate an all-reduce, split(a) → split(b)
// an all-to-all, and replicate → split, replicate → partial and
// split → partial a local slice with no communication. MatMul gives the
// placement of a product from its operands' (the SBP signatures
// S(0)×B→S(0), B×S(1)→S(1), S(1)×S(0)→P, and the linear ones).
package dtensor

import (
	"context"
	"fmt"
	"slices"

	"github.com/phalanx-rt/phalanx/collective"
)

// Kind is how a tensor lives on its group.
type Kind uint8

const (
	// KindReplicate: every rank holds the whole tensor.
	KindReplicate Kind = iota
	// KindSplit: each rank holds a range of one axis.
	KindSplit
	// KindPartial: every rank holds a whole-shaped addend.
	KindPartial
)

// Placement is a tensor's placement on a group: Split(axis), Replicate()
// or Partial().
type Placement struct {
	Kind Kind
	Axis int // KindSplit's axis
}

// Split places a tensor cut along axis.
func Split(axis int) Placement { return Placement{Kind: KindSplit, Axis: axis} }

// Replicate places a whole copy on every rank.
func Replicate() Placement { return Placement{Kind: KindReplicate} }

// Partial places a whole-shaped addend on every rank.
func Partial() Placement { return Placement{Kind: KindPartial} }

// String is OneFlow's notation: S(axis), B or P.
func (p Placement) String() string {
	switch p.Kind {
	case KindSplit:
		return fmt.Sprintf("S(%d)", p.Axis)
	case KindReplicate:
		return "B"
	case KindPartial:
		return "P"
	}
	return fmt.Sprintf("placement(%d)", p.Kind)
}

// Tensor is a distributed tensor: this rank's local shard (row-major over
// LocalShape), its placement and the logical shape, on group G.
type Tensor struct {
	Shape []int
	Place Placement
	Local []float32
	G     *collective.Group
}

// New makes a tensor of logical shape on g with a zeroed local shard.
func New(g *collective.Group, shape []int, p Placement) (*Tensor, error) {
	t := &Tensor{Shape: slices.Clone(shape), Place: p, G: g}
	if err := t.check(); err != nil {
		return nil, err
	}
	t.Local = make([]float32, count(t.LocalShape()))
	return t, nil
}

func (t *Tensor) check() error {
	for _, n := range t.Shape {
		if n < 0 {
			return fmt.Errorf("dtensor: shape %v has a negative length", t.Shape)
		}
	}
	if t.Place.Kind > KindPartial {
		return fmt.Errorf("dtensor: unknown placement %v", t.Place)
	}
	if t.Place.Kind == KindSplit && (t.Place.Axis < 0 || t.Place.Axis >= len(t.Shape)) {
		return fmt.Errorf("dtensor: %v of a tensor of shape %v: no axis %d", t.Place, t.Shape, t.Place.Axis)
	}
	return nil
}

// LocalShape is the shape of this rank's shard.
func (t *Tensor) LocalShape() []int { return localShape(t.Shape, t.Place, t.G.Size(), t.G.Rank()) }

func localShape(shape []int, p Placement, size, rank int) []int {
	s := slices.Clone(shape)
	if p.Kind == KindSplit {
		lo, hi := collective.ShardRange(shape[p.Axis], size, rank)
		s[p.Axis] = hi - lo
	}
	return s
}

// Range is the range of axis a rank of a group of size holds under
// Split(axis) of a tensor of shape.
func Range(shape []int, axis, size, rank int) (lo, hi int) {
	return collective.ShardRange(shape[axis], size, rank)
}

func count(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// block copies between a tensor of shape and one of its blocks: the
// elements whose index on axis lies in [lo, hi). toBlock copies from the
// tensor into the block, otherwise back.
func block(tensor []float32, shape []int, axis, lo, hi int, blk []float32, toBlock bool) {
	outer, inner := count(shape[:axis]), count(shape[axis+1:])
	run, stride := (hi-lo)*inner, shape[axis]*inner
	for o := range outer {
		t := tensor[o*stride+lo*inner : o*stride+lo*inner+run]
		b := blk[o*run : (o+1)*run]
		if toBlock {
			copy(b, t)
		} else {
			copy(t, b)
		}
	}
}

// Redistribute returns t in placement to (t itself when it is already
// so), communicating on t's group as little as the pair of placements
// needs. Every rank of the group calls it with the same tensor shape and
// placements.
func Redistribute(ctx context.Context, t *Tensor, to Placement) (*Tensor, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	out := &Tensor{Shape: t.Shape, Place: to, G: t.G}
	if err := out.check(); err != nil {
		return nil, err
	}
	if want := count(t.LocalShape()); len(t.Local) != want {
		return nil, fmt.Errorf("dtensor: a %v shard of %v holds %d elements, want %d", t.Place, t.Shape, len(t.Local), want)
	}
	from, g := t.Place, t.G
	size, rank := g.Size(), g.Rank()
	if from == to {
		return t, nil
	}
	out.Local = make([]float32, count(out.LocalShape()))
	switch {
	case from.Kind == KindReplicate && to.Kind == KindSplit: // a local slice
		lo, hi := Range(t.Shape, to.Axis, size, rank)
		block(t.Local, t.Shape, to.Axis, lo, hi, out.Local, true)
	case from.Kind == KindReplicate && to.Kind == KindPartial: // rank 0 keeps it, the others add zero
		if rank == 0 {
			copy(out.Local, t.Local)
		}
	case from.Kind == KindSplit && to.Kind == KindPartial: // its own block, zeros elsewhere
		lo, hi := Range(t.Shape, from.Axis, size, rank)
		block(out.Local, t.Shape, from.Axis, lo, hi, t.Local, false)
	case from.Kind == KindPartial && to.Kind == KindReplicate:
		copy(out.Local, t.Local)
		if err := g.AllReduce(ctx, collective.Float32s(out.Local), collective.Sum); err != nil {
			return nil, fmt.Errorf("dtensor: %v → %v: %w", from, to, err)
		}
	case from.Kind == KindSplit && to.Kind == KindReplicate:
		if err := gather(ctx, t, out); err != nil {
			return nil, fmt.Errorf("dtensor: %v → %v: %w", from, to, err)
		}
	case from.Kind == KindPartial && to.Kind == KindSplit:
		if err := reduceScatter(ctx, t, out); err != nil {
			return nil, fmt.Errorf("dtensor: %v → %v: %w", from, to, err)
		}
	case from.Kind == KindSplit && to.Kind == KindSplit:
		if err := allToAll(ctx, t, out); err != nil {
			return nil, fmt.Errorf("dtensor: %v → %v: %w", from, to, err)
		}
	default:
		return nil, fmt.Errorf("dtensor: no redistribution from %v to %v", from, to)
	}
	return out, nil
}

// blockCuts are the offsets of every rank's block of axis in a buffer
// holding the blocks one after another, in rank order.
func blockCuts(shape []int, axis, size int) []int {
	cuts := make([]int, size+1)
	for r := range size {
		lo, hi := Range(shape, axis, size, r)
		s := slices.Clone(shape)
		s[axis] = hi - lo
		cuts[r+1] = cuts[r] + count(s)
	}
	return cuts
}

// gather: split → replicate, an all-gather of every rank's block, then
// each block put in its place.
func gather(ctx context.Context, t, out *Tensor) error {
	g, axis := t.G, t.Place.Axis
	cuts := blockCuts(t.Shape, axis, g.Size())
	buf := make([]float32, cuts[g.Size()])
	copy(buf[cuts[g.Rank()]:], t.Local)
	if err := g.AllGatherRanges(ctx, collective.Float32s(buf), cuts); err != nil {
		return err
	}
	for r := range g.Size() {
		lo, hi := Range(t.Shape, axis, g.Size(), r)
		block(out.Local, t.Shape, axis, lo, hi, buf[cuts[r]:cuts[r+1]], false)
	}
	return nil
}

// reduceScatter: partial → split, the addend laid out block by block in
// rank order, then a reduce-scatter of those blocks.
func reduceScatter(ctx context.Context, t, out *Tensor) error {
	g, axis := t.G, out.Place.Axis
	cuts := blockCuts(t.Shape, axis, g.Size())
	buf := make([]float32, cuts[g.Size()])
	for r := range g.Size() {
		lo, hi := Range(t.Shape, axis, g.Size(), r)
		block(t.Local, t.Shape, axis, lo, hi, buf[cuts[r]:cuts[r+1]], true)
	}
	return g.ReduceScatterRanges(ctx, collective.Float32s(buf), cuts, collective.Float32s(out.Local), collective.Sum)
}

// allToAll: split(a) → split(b). Rank r sends rank q the part of its
// block that q's range of b covers, and puts what each rank p sends it
// (p's range of a, its own of b) in place.
func allToAll(ctx context.Context, t, out *Tensor) error {
	g, a, b := t.G, t.Place.Axis, out.Place.Axis
	size := g.Size()
	mine := t.LocalShape() // a cut to this rank's range
	send, sendCuts := make([]float32, len(t.Local)), make([]int, size+1)
	for q := range size {
		lo, hi := Range(t.Shape, b, size, q)
		s := slices.Clone(mine)
		s[b] = hi - lo
		n := count(s)
		block(t.Local, mine, b, lo, hi, send[sendCuts[q]:sendCuts[q]+n], true)
		sendCuts[q+1] = sendCuts[q] + n
	}
	target := out.LocalShape() // b cut to this rank's range
	recv, recvCuts := make([]float32, len(out.Local)), make([]int, size+1)
	for p := range size {
		lo, hi := Range(t.Shape, a, size, p)
		s := slices.Clone(target)
		s[a] = hi - lo
		recvCuts[p+1] = recvCuts[p] + count(s)
	}
	if err := g.AllToAll(ctx, collective.Float32s(send), sendCuts, collective.Float32s(recv), recvCuts); err != nil {
		return err
	}
	for p := range size {
		lo, hi := Range(t.Shape, a, size, p)
		block(out.Local, target, a, lo, hi, recv[recvCuts[p]:recvCuts[p+1]], false)
	}
	return nil
}

// MatMul is the placement of a·b for operands placed so, on one group
// (a of shape [m, k], b of [k, n]): the SBP signatures S(0)×B→S(0),
// B×S(1)→S(1), S(1)×S(0)→P, B×B→B, and the linear P×B→P and B×P→P. Any
// other pair is an error naming both placements: redistribute an operand
// first.
func MatMul(a, b Placement) (Placement, error) {
	switch {
	case a == Split(0) && b == Replicate():
		return Split(0), nil
	case a == Replicate() && b == Split(1):
		return Split(1), nil
	case a == Split(1) && b == Split(0):
		return Partial(), nil
	case a == Replicate() && b == Replicate():
		return Replicate(), nil
	case a == Partial() && b == Replicate(), a == Replicate() && b == Partial():
		return Partial(), nil
	}
	return Placement{}, fmt.Errorf("dtensor: no matmul signature for %v × %v (want S(0)×B, B×S(1), S(1)×S(0), B×B, P×B or B×P)", a, b)
}
