package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/worker"
)

// rings is the program's own dataset: points whose first two coordinates
// lie on one of classes concentric rings (the class), the other features
// noise. A model must learn the radius, a nonlinear function of the
// inputs.
type rings struct {
	features int
	x        []float32
	y        []int32
}

var _ phalanx.Dataset = (*rings)(nil)

func newRings(n, features, classes int, seed, stream uint64) *rings {
	rng := rand.New(rand.NewPCG(seed, stream))
	d := &rings{features: features, x: make([]float32, n*features), y: make([]int32, n)}
	for i := range n {
		c := rng.IntN(classes)
		r := 0.5 + float64(c) + 0.25*rng.NormFloat64()
		a := 2 * math.Pi * rng.Float64()
		row := d.x[i*features : (i+1)*features]
		row[0], row[1] = float32(r*math.Cos(a)), float32(r*math.Sin(a))
		for j := 2; j < features; j++ {
			row[j] = float32(0.5 * rng.NormFloat64())
		}
		d.y[i] = int32(c)
	}
	return d
}

func (d *rings) Len() int { return len(d.y) }

func (d *rings) Fill(idx []int, b *worker.Batch) error {
	b.Reset(len(idx), d.features)
	for k, i := range idx {
		if i < 0 || i >= len(d.y) {
			return fmt.Errorf("rings: sample %d outside a set of %d", i, len(d.y))
		}
		copy(b.X[k*d.features:(k+1)*d.features], d.x[i*d.features:(i+1)*d.features])
		b.Labels[k] = d.y[i]
	}
	return nil
}
