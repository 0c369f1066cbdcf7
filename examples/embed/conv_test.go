package main

import (
	"math"
	"testing"

	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// TestConvGradients checks the hand-written backward pass against central
// differences of the loss, parameter by parameter.
func TestConvGradients(t *testing.T) {
	data, err := newShapes(8, 8, 0.3, 7, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := newConvNet(8, 3, 4, 7)
	if err != nil {
		t.Fatal(err)
	}
	var b worker.Batch
	if err := data.Fill([]int{0, 1, 2, 3, 4, 5, 6, 7}, &b); err != nil {
		t.Fatal(err)
	}
	nn.ZeroGrads(m.Params())
	if _, err := m.Step(&b, 1, nil); err != nil {
		t.Fatal(err)
	}
	loss := func() float64 {
		r, err := m.Evaluate(&b)
		if err != nil {
			t.Fatal(err)
		}
		return r.LossSum
	}
	for _, p := range m.Params() {
		for i := 0; i < len(p.Value); i += max(1, len(p.Value)/7) {
			v := p.Value[i]
			const h = 1e-4
			p.Value[i] = v + h
			up := loss()
			p.Value[i] = v - h
			down := loss()
			p.Value[i] = v
			num := (up - down) / (2 * h)
			if got := float64(p.Grad[i]); math.Abs(got-num) > 2e-2*max(1, math.Abs(num)) {
				t.Errorf("%s[%d]: gradient %.5f, central difference %.5f", p.Name, i, got, num)
			}
		}
	}
}
