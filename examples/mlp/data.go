package mlp

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx/worker"
)

// Data is an in-memory classification set of fixed-width float32 rows.
type Data struct {
	Features, Classes int
	X                 []float32
	Y                 []int32
}

// Len is the number of samples.
func (d *Data) Len() int { return len(d.Y) }

// Fill copies the samples idx into b.
func (d *Data) Fill(idx []int, b *worker.Batch) error {
	b.Reset(len(idx), d.Features)
	for k, i := range idx {
		if i < 0 || i >= len(d.Y) {
			return fmt.Errorf("mlp: sample %d outside a set of %d", i, len(d.Y))
		}
		copy(b.X[k*d.Features:(k+1)*d.Features], d.X[i*d.Features:(i+1)*d.Features])
		b.Labels[k] = d.Y[i]
	}
	return nil
}

// latentDims is the dimension of the synthetic task's hidden factors.
const latentDims = 16

// Synthetic generates n samples of the teacher task from seed: hidden
// factors z from a standard normal, inputs x = M·z + 0.1·noise through a fixed
// random mixing matrix M, and label the argmax of a fixed random linear
// teacher's logits of z. The class structure lives in a 16-dimensional
// subspace of the inputs, so it is learnable from a few epochs of data; M and
// the teacher depend on seed only, so a training and a test set made with the
// same seed and different streams share them.
func Synthetic(n, features, classes int, seed, stream uint64) (*Data, error) {
	if n <= 0 || features <= 0 || classes < 2 {
		return nil, fmt.Errorf("mlp: synthetic set of %d samples, %d features, %d classes", n, features, classes)
	}
	trng := rand.New(rand.NewPCG(seed, 0x7465616368))
	mix := make([]float64, features*latentDims)
	for i := range mix {
		mix[i] = trng.NormFloat64() / math.Sqrt(latentDims)
	}
	teacher := make([]float64, latentDims*classes)
	for i := range teacher {
		teacher[i] = trng.NormFloat64()
	}
	d := &Data{Features: features, Classes: classes, X: make([]float32, n*features), Y: make([]int32, n)}
	rng := rand.New(rand.NewPCG(seed, stream))
	z := make([]float64, latentDims)
	logits := make([]float64, classes)
	for i := range n {
		for j := range z {
			z[j] = rng.NormFloat64()
		}
		x := d.X[i*features : (i+1)*features]
		for f := range x {
			v := 0.1 * rng.NormFloat64()
			for j, zj := range z {
				v += mix[f*latentDims+j] * zj
			}
			x[f] = float32(v)
		}
		clear(logits)
		for j, zj := range z {
			for c := range logits {
				logits[c] += zj * teacher[j*classes+c]
			}
		}
		best := 0
		for c, v := range logits {
			if v > logits[best] {
				best = c
			}
		}
		d.Y[i] = int32(best)
	}
	return d, nil
}
