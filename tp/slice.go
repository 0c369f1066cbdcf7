package tp

import (
	"fmt"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// Slice says where one rank's parameter lies in its logical (unsplit)
// tensor: the local values are the logical tensor's ranges along Axis,
// side by side in order, or the whole tensor when Ranges is empty.
// Checkpoints store logical tensors; Slices are how a rank reads and
// writes its part of them.
type Slice struct {
	Local  *nn.Param
	Shape  []int // the logical tensor's shape
	Axis   int
	Ranges [][2]int // [lo, hi) along Axis; none: the whole tensor
	// Blocks: Axis is cut into this many equal blocks, and the rank holds
	// collective.ShardRange of each (BlockRanges): how the slice of any
	// rank of any group size is found from one's. 0 for a whole tensor.
	Blocks int
}

// BlockRanges are the ranges along an axis of n that rank holds of a
// group of size when the axis is cut into blocks equal blocks, each
// shared out by collective.ShardRange.
func BlockRanges(n, blocks, size, rank int) [][2]int {
	bw := n / blocks
	lo, hi := collective.ShardRange(bw, size, rank)
	out := make([][2]int, blocks)
	for b := range blocks {
		out[b] = [2]int{b*bw + lo, b*bw + hi}
	}
	return out
}

// At is the same slice as another rank of a group of size holds it, its
// Local left nil.
func (s Slice) At(size, rank int) Slice {
	if !s.Split() {
		return Slice{Shape: s.Shape}
	}
	return Slice{Shape: s.Shape, Axis: s.Axis, Blocks: s.Blocks, Ranges: BlockRanges(s.Shape[s.Axis], s.Blocks, size, rank)}
}

// Len is the number of values the slice holds.
func (s Slice) Len() int {
	n := 1
	for _, d := range s.Shape {
		n *= d
	}
	if !s.Split() {
		return n
	}
	outer, _, inner := s.geometry()
	var w int
	for _, r := range s.Ranges {
		w += r[1] - r[0]
	}
	return outer * w * inner
}

// Whole is a parameter every rank holds whole.
func Whole(p *nn.Param) Slice { return Slice{Local: p, Shape: p.Shape} }

// Sliced is a layer whose parameters are slices of logical tensors.
type Sliced interface {
	Slices() []Slice
}

// SlicesOf is the slices of every parameter of layers, in their order: a
// Sliced layer's own, a Residual's body's, and any other layer's whole.
func SlicesOf(layers ...nn.Layer) []Slice {
	var out []Slice
	for _, l := range layers {
		switch l := l.(type) {
		case Sliced:
			out = append(out, l.Slices()...)
		case *nn.Residual:
			out = append(out, SlicesOf(l.Body...)...)
		default:
			for _, p := range l.Params() {
				out = append(out, Whole(p))
			}
		}
	}
	return out
}

// Split reports whether the slice is a part of its tensor.
func (s Slice) Split() bool { return len(s.Ranges) > 0 }

// geometry is the logical tensor as [outer, Shape[Axis], inner].
func (s Slice) geometry() (outer, n, inner int) {
	outer, inner = 1, 1
	for i, d := range s.Shape {
		switch {
		case i < s.Axis:
			outer *= d
		case i > s.Axis:
			inner *= d
		}
	}
	return outer, s.Shape[s.Axis], inner
}

// Check is an error when the slice does not fit its tensor or its local
// parameter.
func (s Slice) Check() error {
	want := 1
	for _, d := range s.Shape {
		want *= d
	}
	if s.Split() {
		if s.Axis < 0 || s.Axis >= len(s.Shape) {
			return fmt.Errorf("tp: %s: axis %d of a tensor of shape %v", s.Local.Name, s.Axis, s.Shape)
		}
		outer, n, inner := s.geometry()
		var w int
		for _, r := range s.Ranges {
			if r[0] < 0 || r[1] > n || r[0] > r[1] {
				return fmt.Errorf("tp: %s: range [%d, %d) of an axis of %d", s.Local.Name, r[0], r[1], n)
			}
			w += r[1] - r[0]
		}
		want = outer * w * inner
	}
	if len(s.Local.Value) != want {
		return fmt.Errorf("tp: %s: %d local values for a slice of %d of shape %v", s.Local.Name, len(s.Local.Value), want, s.Shape)
	}
	return nil
}

// Take copies the slice's part of logical (the whole tensor) into dst,
// laid out as the local parameter is.
func (s Slice) Take(logical, dst []float32) { s.move(logical, dst, true) }

// Put copies src, laid out as the local parameter is, into the slice's
// part of logical.
func (s Slice) Put(src, logical []float32) { s.move(logical, src, false) }

func (s Slice) move(logical, local []float32, take bool) {
	if !s.Split() {
		if take {
			copy(local, logical)
		} else {
			copy(logical, local)
		}
		return
	}
	outer, n, inner := s.geometry()
	at := 0
	for o := range outer {
		for _, r := range s.Ranges {
			w := (r[1] - r[0]) * inner
			l := logical[(o*n+r[0])*inner : (o*n+r[0])*inner+w]
			if take {
				copy(local[at:at+w], l)
			} else {
				copy(l, local[at:at+w])
			}
			at += w
		}
	}
}

// Slices: W's columns (of each block) and b's.
func (l *ColumnParallel) Slices() []Slice {
	bw := l.out / l.blocks
	var rs [][2]int
	for b := range l.blocks {
		rs = append(rs, [2]int{b*bw + l.lo, b*bw + l.hi})
	}
	in := l.Local.W.Shape[0]
	return []Slice{
		{Local: l.Local.W, Shape: []int{in, l.out}, Axis: 1, Ranges: rs, Blocks: l.blocks},
		{Local: l.Local.B, Shape: []int{l.out}, Axis: 0, Ranges: rs, Blocks: l.blocks},
	}
}

// Slices: W's rows, and b whole.
func (l *RowParallel) Slices() []Slice {
	out := l.Local.W.Shape[1]
	w := Slice{Local: l.Local.W, Shape: []int{l.in, out}, Axis: 0, Ranges: [][2]int{{l.lo, l.hi}}, Blocks: 1}
	if l.SeqParallel {
		return []Slice{w} // B is the SeqScatter's
	}
	return []Slice{w, Whole(l.B)}
}

// Slices: the table's rows.
func (e *VocabParallelEmbedding) Slices() []Slice {
	return []Slice{{Local: e.Table, Shape: []int{e.vocab, e.Table.Shape[1]}, Axis: 0, Ranges: [][2]int{{e.lo, e.hi}}, Blocks: 1}}
}
