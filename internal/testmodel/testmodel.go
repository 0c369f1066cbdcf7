// Package testmodel is a small model of an embedder's own, for the
// runtime's tests: a linear regression y = w·x + b with its forward and
// backward written by hand, and its rows of data. It is for tests only.
package testmodel

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// Regression is y = w·x + b over Features inputs, squared error; a sample
// is Correct when its error's square is below 0.01.
type Regression struct {
	Features int
	W        *nn.Param // w then b
	// OnStep, when set, is called before each training step (calls
	// counted from 1, rollbacks' replays included) and may hold it or
	// fail it.
	OnStep func(call int) error
	// NaNAt, when positive, is the training call whose loss and gradient
	// element 1 are NaN, on every rank alike.
	NaNAt int
	calls int
}

// NewRegression is a regression over features inputs, its parameters 0.
func NewRegression(features int) *Regression {
	return &Regression{Features: features, W: nn.NewParam("w", features+1)}
}

// Params is w.
func (m *Regression) Params() []*nn.Param { return []*nn.Param{m.W} }

// Step adds the batch's gradient, scaled, to w's (scale 0: evaluation).
func (m *Regression) Step(b *worker.Batch, scale float32, _ func(int)) (r worker.Result, _ error) {
	if scale != 0 {
		m.calls++
		if m.OnStep != nil {
			if err := m.OnStep(m.calls); err != nil {
				return r, err
			}
		}
	}
	f := m.Features
	if b.Features != f+1 {
		return r, fmt.Errorf("regression: %d columns, want %d", b.Features, f+1)
	}
	for i := range b.N {
		row := b.X[i*(f+1) : (i+1)*(f+1)]
		e := m.W.Value[f] - row[f]
		for k := range f {
			e += m.W.Value[k] * row[k]
		}
		r.LossSum += float64(e * e)
		if e*e < 0.01 {
			r.Correct++
		}
		for k := range f {
			m.W.Grad[k] += scale * 2 * e * row[k]
		}
		m.W.Grad[f] += scale * 2 * e
	}
	if scale != 0 && m.calls == m.NaNAt {
		r.LossSum, m.W.Grad[1] = math.NaN(), float32(math.NaN())
	}
	return r, nil
}

// Evaluate measures the batch without training.
func (m *Regression) Evaluate(b *worker.Batch) (worker.Result, error) { return m.Step(b, 0, nil) }

// Rows are n samples of y = Σ (k+1)·x_k + 0.5, x uniform in [0, 1), each
// row its features and then y.
type Rows struct {
	features int
	x        []float32
}

// NewRows draws n rows of features inputs from seed.
func NewRows(n, features int, seed uint64) *Rows {
	rng := rand.New(rand.NewPCG(seed, 9))
	r := &Rows{features: features, x: make([]float32, n*(features+1))}
	for i := range n {
		row := r.x[i*(features+1) : (i+1)*(features+1)]
		y := float32(0.5)
		for k := range features {
			row[k] = rng.Float32()
			y += float32(k+1) * row[k]
		}
		row[features] = y
	}
	return r
}

// Len is the number of rows.
func (r *Rows) Len() int { return len(r.x) / (r.features + 1) }

// Fill copies rows idx into b.
func (r *Rows) Fill(idx []int, b *worker.Batch) error {
	w := r.features + 1
	b.Reset(len(idx), w)
	for k, i := range idx {
		copy(b.X[k*w:(k+1)*w], r.x[i*w:(i+1)*w])
	}
	return nil
}
