package mlp

import (
	"fmt"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// Model is an MLP classifier; it implements worker.Model and worker.Evaluator.
type Model struct {
	net  *nn.Sequential
	loss nn.SoftmaxCrossEntropy
	in   int
}

// New builds an MLP with the given layer widths (inputs first, classes last),
// its weights drawn from seed, so every rank builds the same one.
func New(widths []int, seed uint64) (*Model, error) {
	if len(widths) < 2 {
		return nil, fmt.Errorf("mlp: %d layer widths: want inputs, hidden..., classes", len(widths))
	}
	for _, w := range widths {
		if w <= 0 {
			return nil, fmt.Errorf("mlp: layer width %d: want positive widths", w)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x6d6c70))
	var layers []nn.Layer
	for i := 0; i+1 < len(widths); i++ {
		if i > 0 {
			layers = append(layers, &nn.ReLU{})
		}
		layers = append(layers, nn.NewDense(fmt.Sprintf("dense%d", i+1), widths[i], widths[i+1], rng))
	}
	return &Model{net: nn.NewSequential(layers...), in: widths[0]}, nil
}

// Params lists the weights and biases, first layer first.
func (m *Model) Params() []*nn.Param { return m.net.Params() }

func (m *Model) input(b *worker.Batch) (nn.Matrix, error) {
	if b.Features != m.in || len(b.X) != b.N*b.Features || len(b.Labels) != b.N {
		return nn.Matrix{}, fmt.Errorf("mlp: batch of %d samples × %d features with %d values and %d labels; the model takes %d features",
			b.N, b.Features, len(b.X), len(b.Labels), m.in)
	}
	return nn.Matrix{Rows: b.N, Cols: b.Features, Data: b.X}, nil
}

// Step is forward, loss and backward; gradients are announced layer by layer.
func (m *Model) Step(b *worker.Batch, scale float32, ready func(int)) (worker.Result, error) {
	x, err := m.input(b)
	if err != nil {
		return worker.Result{}, err
	}
	sum, correct, grad, err := m.loss.Loss(m.net.Forward(x), b.Labels, scale)
	if err != nil {
		return worker.Result{}, err
	}
	m.net.Backward(grad, ready)
	return worker.Result{LossSum: sum, Correct: correct}, nil
}

// Evaluate scores a batch.
func (m *Model) Evaluate(b *worker.Batch) (worker.Result, error) {
	x, err := m.input(b)
	if err != nil {
		return worker.Result{}, err
	}
	sum, correct, _, err := m.loss.Loss(m.net.Forward(x), b.Labels, 0)
	return worker.Result{LossSum: sum, Correct: correct}, err
}
