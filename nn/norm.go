package nn

import "math"

// LayerNorm normalises each row to zero mean and unit variance, then
// scales and shifts it by learned per-feature Gain and Bias (starting at 1
// and 0): y = γ ⊙ (x − μ) / √(σ² + ε) + β. It is Slotted and a Splitter.
type LayerNorm struct {
	Gain, Bias *Param
	Eps        float32
	slots      []normCache
	slot       int
}

// normCache is one forward pass's normalised input and per-row inverse
// deviations, and the buffers it returns.
type normCache struct {
	xhat, rstd, y, dx []float32
	dy                Matrix // BackwardInput's, the caller's: valid until BackwardWeight
}

// NewLayerNorm makes a LayerNorm of width features, ε 1e-5.
func NewLayerNorm(name string, width int) *LayerNorm {
	l := &LayerNorm{Gain: NewParam(name+".gain", width), Bias: NewParam(name+".bias", width), Eps: 1e-5}
	for i := range l.Gain.Value {
		l.Gain.Value[i] = 1
	}
	return l
}

func (l *LayerNorm) Params() []*Param { return []*Param{l.Gain, l.Bias} }

// UseSlot makes the following calls use cache slot i (see Slotted).
func (l *LayerNorm) UseSlot(i int) { useSlot(&l.slots, &l.slot, i) }

// ActivationBytes is the size of the buffers of every slot allocated so far.
func (l *LayerNorm) ActivationBytes() int64 {
	var n int
	for _, c := range l.slots {
		n += cap(c.xhat) + cap(c.rstd) + cap(c.y) + cap(c.dx)
	}
	return 4 * int64(n)
}

func (l *LayerNorm) Forward(x Matrix) Matrix {
	c := slotOf(&l.slots, l.slot)
	y := resize(&c.y, x.Rows, x.Cols)
	xhat := resize(&c.xhat, x.Rows, x.Cols)
	rstd := resize(&c.rstd, x.Rows, 1)
	n := float64(x.Cols)
	for r := range x.Rows {
		row := x.Data[r*x.Cols : (r+1)*x.Cols]
		mu := sum4(row, 0, false) / n
		inv := 1 / math.Sqrt(sum4(row, mu, true)/n+float64(l.Eps))
		rstd.Data[r] = float32(inv)
		h, out := xhat.Data[r*x.Cols:(r+1)*x.Cols], y.Data[r*x.Cols:(r+1)*x.Cols]
		for j, v := range row {
			h[j] = float32((float64(v) - mu) * inv)
			out[j] = h[j]*l.Gain.Value[j] + l.Bias.Value[j]
		}
	}
	return y
}

func (l *LayerNorm) Backward(dy Matrix) Matrix {
	dx := l.BackwardInput(dy)
	l.BackwardWeight()
	return dx
}

// BackwardInput returns the input's gradient and keeps dy (the caller's,
// valid until BackwardWeight) in the current slot.
func (l *LayerNorm) BackwardInput(dy Matrix) Matrix {
	c := slotOf(&l.slots, l.slot)
	c.dy = dy
	dx := resize(&c.dx, dy.Rows, dy.Cols)
	n := float64(dy.Cols)
	for r := range dy.Rows {
		d := dy.Data[r*dy.Cols : (r+1)*dy.Cols]
		h := c.xhat[r*dy.Cols : (r+1)*dy.Cols]
		// dxhat = dy ⊙ γ; dx = rstd · (dxhat − mean(dxhat) − xhat · mean(dxhat ⊙ xhat))
		var m1, m2 float64
		for j, g := range d {
			dh := float64(g * l.Gain.Value[j])
			m1 += dh
			m2 += dh * float64(h[j])
		}
		m1, m2 = m1/n, m2/n
		inv := float64(c.rstd[r])
		out := dx.Data[r*dy.Cols : (r+1)*dy.Cols]
		for j, g := range d {
			dh := float64(g * l.Gain.Value[j])
			out[j] = float32(inv * (dh - m1 - float64(h[j])*m2))
		}
	}
	return dx
}

// BackwardWeight adds the gain's and bias's gradients of the slot's last
// BackwardInput.
func (l *LayerNorm) BackwardWeight() {
	c := slotOf(&l.slots, l.slot)
	dy := c.dy
	for r := range dy.Rows {
		d := dy.Data[r*dy.Cols : (r+1)*dy.Cols]
		h := c.xhat[r*dy.Cols : (r+1)*dy.Cols]
		for j, g := range d {
			l.Gain.Grad[j] += g * h[j]
			l.Bias.Grad[j] += g
		}
	}
}

// sum4 is the sum of row's values less mu, or of their squares, in four
// running sums (one would wait on each addition before the next).
func sum4(row []float32, mu float64, squares bool) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(row); i += 4 {
		a, b, c, d := float64(row[i])-mu, float64(row[i+1])-mu, float64(row[i+2])-mu, float64(row[i+3])-mu
		if squares {
			a, b, c, d = a*a, b*b, c*c, d*d
		}
		s0, s1, s2, s3 = s0+a, s1+b, s2+c, s3+d
	}
	for ; i < len(row); i++ {
		a := float64(row[i]) - mu
		if squares {
			a *= a
		}
		s0 += a
	}
	return (s0 + s1) + (s2 + s3)
}

// GELU is the Gaussian error linear unit in GPT-2's tanh form:
// 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))). It is Slotted; its zero
// value is ready. It keeps its input, the caller's, until the backward.
type GELU struct {
	slots []geluCache
	slot  int
}

type geluCache struct {
	x     []float32 // the caller's
	t     []float32 // tanh of each input's argument, for the backward
	y, dx []float32
}

func (g *GELU) Params() []*Param { return nil }

// UseSlot makes the following calls use cache slot i (see Slotted).
func (g *GELU) UseSlot(i int) { useSlot(&g.slots, &g.slot, i) }

// ActivationBytes is the size of the buffers of every slot allocated so far.
func (g *GELU) ActivationBytes() int64 {
	var n int
	for _, c := range g.slots {
		n += cap(c.t) + cap(c.y) + cap(c.dx)
	}
	return 4 * int64(n)
}

const geluC = 0.7978845608028654 // √(2/π)

func (g *GELU) Forward(x Matrix) Matrix {
	c := slotOf(&g.slots, g.slot)
	c.x = x.Data
	y := resize(&c.y, x.Rows, x.Cols)
	t := resize(&c.t, x.Rows, x.Cols).Data
	for i, u := range x.Data {
		t[i] = geluC * (u + 0.044715*u*u*u)
	}
	tanh32s(t, t)
	for i, u := range x.Data {
		y.Data[i] = 0.5 * u * (1 + t[i])
	}
	return y
}

func (g *GELU) Backward(dy Matrix) Matrix {
	c := slotOf(&g.slots, g.slot)
	dx := resize(&c.dx, dy.Rows, dy.Cols)
	x, t := c.x[:len(dy.Data)], c.t[:len(dy.Data)]
	for i, d := range dy.Data {
		u, th := x[i], t[i]
		dt := (1 - th*th) * geluC * (1 + 3*0.044715*u*u)
		dx.Data[i] = d * (0.5*(1+th) + 0.5*u*dt)
	}
	return dx
}
