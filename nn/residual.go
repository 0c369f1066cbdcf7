package nn

import "fmt"

// Residual is y = x + Body(x), Body's layers run in order: with a
// LayerNorm first, one half of a pre-norm transformer block (GPT-2's
// x + Attention(LN(x)), then x + MLP(LN(x))). Its parameters are the
// body's, in order. It is Slotted: UseSlot selects the slot of every
// Slotted layer of the body too.
type Residual struct {
	Body   []Layer
	params []*Param
	slots  []resCache
	slot   int
}

type resCache struct{ y, dx []float32 }

// NewResidual wraps body, which must keep the width of its input.
func NewResidual(body ...Layer) *Residual {
	r := &Residual{Body: body}
	for _, l := range body {
		r.params = append(r.params, l.Params()...)
	}
	return r
}

func (r *Residual) Params() []*Param { return r.params }

// UseSlot makes the following calls use cache slot i (see Slotted); a
// body layer that is not Slotted has one slot only.
func (r *Residual) UseSlot(i int) {
	useSlot(&r.slots, &r.slot, i)
	for _, l := range r.Body {
		if s, ok := l.(Slotted); ok {
			s.UseSlot(i)
		} else if i != 0 {
			panic(fmt.Sprintf("nn: residual body layer %T has no cache slots", l))
		}
	}
}

// ActivationBytes is the size of the buffers of every slot allocated so
// far, the body's included.
func (r *Residual) ActivationBytes() int64 {
	var n int64
	for _, c := range r.slots {
		n += 4 * int64(cap(c.y)+cap(c.dx))
	}
	for _, l := range r.Body {
		if a, ok := l.(interface{ ActivationBytes() int64 }); ok {
			n += a.ActivationBytes()
		}
	}
	return n
}

func (r *Residual) Forward(x Matrix) Matrix {
	h := x
	for _, l := range r.Body {
		h = l.Forward(h)
	}
	if h.Rows != x.Rows || h.Cols != x.Cols {
		panic(fmt.Sprintf("nn: residual body maps %d × %d to %d × %d", x.Rows, x.Cols, h.Rows, h.Cols))
	}
	c := slotOf(&r.slots, r.slot)
	y := resize(&c.y, x.Rows, x.Cols)
	for i, v := range x.Data {
		y.Data[i] = v + h.Data[i]
	}
	return y
}

// Backward is dy through the body plus dy itself.
func (r *Residual) Backward(dy Matrix) Matrix {
	g := dy
	for i := len(r.Body) - 1; i >= 0; i-- {
		g = r.Body[i].Backward(g)
	}
	c := slotOf(&r.slots, r.slot)
	dx := resize(&c.dx, dy.Rows, dy.Cols)
	for i, v := range dy.Data {
		dx.Data[i] = v + g.Data[i]
	}
	return dx
}
