package mlp

import (
	"fmt"
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

// Synthetic generates n samples of the teacher task from seed: x from a
// standard normal, y the argmax of a fixed random linear teacher's logits.
// The teacher depends on seed only, so a training set and a test set made
// with the same seed and different streams share it.
func Synthetic(n, features, classes int, seed, stream uint64) (*Data, error) {
	if n <= 0 || features <= 0 || classes < 2 {
		return nil, fmt.Errorf("mlp: synthetic set of %d samples, %d features, %d classes", n, features, classes)
	}
	teacher := make([]float64, features*classes)
	trng := rand.New(rand.NewPCG(seed, 0x7465616368))
	for i := range teacher {
		teacher[i] = trng.NormFloat64()
	}
	d := &Data{Features: features, Classes: classes, X: make([]float32, n*features), Y: make([]int32, n)}
	rng := rand.New(rand.NewPCG(seed, stream))
	logits := make([]float64, classes)
	for i := range n {
		x := d.X[i*features : (i+1)*features]
		clear(logits)
		for j := range x {
			v := rng.NormFloat64()
			x[j] = float32(v)
			w := teacher[j*classes : (j+1)*classes]
			for c := range logits {
				logits[c] += v * w[c]
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
