package nn

import (
	"fmt"
	"math/rand/v2"
)

// Positions adds a learned embedding of each token's position to its row:
// the input's rows are sequences of Seq consecutive tokens, and row i of a
// sequence gets row i of the [Seq, Width] table added, as GPT-2's learned
// positional embeddings. It is Slotted.
type Positions struct {
	Table      *Param
	Seq, Width int
	slots      []posCache
	slot       int
}

type posCache struct{ y []float32 }

// NewPositions makes a table for sequences of seq tokens of width
// features, with N(0, 0.02²) entries drawn from rng.
func NewPositions(name string, seq, width int, rng *rand.Rand) *Positions {
	p := &Positions{Table: NewParam(name+".table", seq, width), Seq: seq, Width: width}
	for i := range p.Table.Value {
		p.Table.Value[i] = float32(0.02 * rng.NormFloat64())
	}
	return p
}

func (p *Positions) Params() []*Param { return []*Param{p.Table} }

// UseSlot makes the following calls use cache slot i (see Slotted).
func (p *Positions) UseSlot(i int) { useSlot(&p.slots, &p.slot, i) }

// ActivationBytes is the size of the buffers of every slot allocated so far.
func (p *Positions) ActivationBytes() int64 {
	var n int
	for _, c := range p.slots {
		n += cap(c.y)
	}
	return 4 * int64(n)
}

func (p *Positions) Forward(x Matrix) Matrix {
	if x.Cols != p.Width || x.Rows%p.Seq != 0 {
		panic(fmt.Sprintf("nn: %s: positions of %d features in sequences of %d, got %d × %d", p.Table.Name, p.Width, p.Seq, x.Rows, x.Cols))
	}
	c := slotOf(&p.slots, p.slot)
	y := resize(&c.y, x.Rows, x.Cols)
	for r := range x.Rows {
		pos := p.Table.Value[(r%p.Seq)*p.Width : (r%p.Seq+1)*p.Width]
		for j, v := range x.Data[r*x.Cols : (r+1)*x.Cols] {
			y.Data[r*x.Cols+j] = v + pos[j]
		}
	}
	return y
}

// Backward adds each row's gradient into its position's row, and passes
// it on unchanged (the input gradient is dy itself).
func (p *Positions) Backward(dy Matrix) Matrix {
	for r := range dy.Rows {
		g := p.Table.Grad[(r%p.Seq)*p.Width : (r%p.Seq+1)*p.Width]
		for j, v := range dy.Data[r*dy.Cols : (r+1)*dy.Cols] {
			g[j] += v
		}
	}
	return dy
}
