package worker

import "github.com/phalanx-rt/phalanx/nn"

// Batch is a set of samples: dense features (N rows of Features values in X)
// and/or integer ids, and class labels.
type Batch struct {
	N        int
	Features int
	X        []float32
	IDs      []int32
	Labels   []int32
}

// Reset empties b for n samples of features values, keeping its buffers:
// X holds n×features values and Labels n labels, both to be overwritten
// (their old contents stay until then; a model without labels ignores
// them), and IDs is emptied, for Fill to append to.
func (b *Batch) Reset(n, features int) {
	b.N, b.Features = n, features
	if cap(b.X) < n*features {
		b.X = make([]float32, n*features)
	}
	b.X = b.X[:n*features]
	if cap(b.Labels) < n {
		b.Labels = make([]int32, n)
	}
	b.Labels = b.Labels[:n]
	b.IDs = b.IDs[:0]
}

// Dataset is indexed training data.
type Dataset interface {
	Len() int
	// Fill loads the samples idx into b, reusing its buffers.
	Fill(idx []int, b *Batch) error
}

// Result is what a model reports for a batch.
type Result struct {
	LossSum float64 // summed over the batch's samples
	Correct int     // samples classified right
}

// Model is what a user trains: named float32 parameters and a step that
// computes the loss of a batch and adds scale × its gradients into the
// parameters' Grad (gradients accumulate; the trainer zeroes them). scale is
// 1/the global batch (the samples of one step over every rank), so that the
// ranks' summed gradients are the mean over the global batch: a model sums
// its per-sample gradients times scale and need not know the world size
// (with local SGD, LocalSteps > 1, it is 1/this rank's batch). When ready
// is not nil, Step calls it with a parameter's index (in Params order) as soon
// as that gradient is complete, so its allreduce overlaps the rest of the
// backward pass; parameters it never names are taken as ready at the end.
type Model interface {
	Params() []*nn.Param
	Step(b *Batch, scale float32, ready func(param int)) (Result, error)
}

// Evaluator is a Model that can score a batch without touching gradients.
type Evaluator interface {
	Evaluate(b *Batch) (Result, error)
}
