package main

import (
	"math"

	"github.com/phalanx-rt/phalanx/nn"
)

// tanh is the program's own activation layer: a plain nn.Layer, with one
// cache (its last output), as any layer written against nn.Layer has. A
// pipeline stage holding it recomputes its forward pass before each
// backward, so the single cache is always the right micro-batch's.
type tanh struct {
	y, dx []float32
}

func (t *tanh) Forward(x nn.Matrix) nn.Matrix {
	t.y = grow(t.y, len(x.Data))
	for i, v := range x.Data {
		t.y[i] = float32(math.Tanh(float64(v)))
	}
	return nn.Matrix{Rows: x.Rows, Cols: x.Cols, Data: t.y}
}

func (t *tanh) Backward(dy nn.Matrix) nn.Matrix {
	t.dx = grow(t.dx, len(dy.Data))
	for i, g := range dy.Data {
		y := t.y[i]
		t.dx[i] = g * (1 - y*y)
	}
	return nn.Matrix{Rows: dy.Rows, Cols: dy.Cols, Data: t.dx}
}

func (t *tanh) Params() []*nn.Param { return nil }

// gain is the program's own layer with parameters: y = x ⊙ g, one learned
// gain per feature (starting at 1).
type gain struct {
	g     *nn.Param
	x     nn.Matrix // the last input, the caller's
	y, dx []float32
}

func newGain(name string, width int) *gain {
	p := nn.NewParam(name, width)
	for i := range p.Value {
		p.Value[i] = 1
	}
	return &gain{g: p}
}

func (l *gain) Forward(x nn.Matrix) nn.Matrix {
	l.x = x
	l.y = grow(l.y, len(x.Data))
	for r := range x.Rows {
		row := x.Data[r*x.Cols : (r+1)*x.Cols]
		out := l.y[r*x.Cols : (r+1)*x.Cols]
		for j, v := range row {
			out[j] = v * l.g.Value[j]
		}
	}
	return nn.Matrix{Rows: x.Rows, Cols: x.Cols, Data: l.y}
}

func (l *gain) Backward(dy nn.Matrix) nn.Matrix {
	l.dx = grow(l.dx, len(dy.Data))
	for r := range dy.Rows {
		d := dy.Data[r*dy.Cols : (r+1)*dy.Cols]
		x := l.x.Data[r*dy.Cols : (r+1)*dy.Cols]
		dx := l.dx[r*dy.Cols : (r+1)*dy.Cols]
		for j, g := range d {
			l.g.Grad[j] += g * x[j]
			dx[j] = g * l.g.Value[j]
		}
	}
	return nn.Matrix{Rows: dy.Rows, Cols: dy.Cols, Data: l.dx}
}

func (l *gain) Params() []*nn.Param { return []*nn.Param{l.g} }

// grow is b with room for n values, reused when it has it.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
