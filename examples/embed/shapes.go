package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx/worker"
)

// shapes is a synthetic image task: side×side images, each holding one
// stroke of four pixels (horizontal, vertical, diagonal or anti-diagonal:
// the class) at a random place, over Gaussian noise. It is drawn from a
// seed, so every worker holds the same images; it implements
// worker.Dataset.
type shapes struct {
	side   int
	pixels []float32 // n × side × side
	labels []int32
}

const strokeLen = 4

func newShapes(n, side int, noise float64, seed, stream uint64) (*shapes, error) {
	if n < 1 || side < strokeLen+2 {
		return nil, fmt.Errorf("shapes: %d images of side %d: want at least 1 image of side %d", n, side, strokeLen+2)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5a9e5+stream))
	strokes := [...][2]int{{0, 1}, {1, 0}, {1, 1}, {1, -1}} // each class's pixel steps
	d := &shapes{side: side, pixels: make([]float32, n*side*side), labels: make([]int32, n)}
	for i := range n {
		img := d.pixels[i*side*side : (i+1)*side*side]
		for p := range img {
			img[p] = float32(rng.NormFloat64() * noise)
		}
		c := rng.IntN(len(strokes))
		di, dj := strokes[c][0], strokes[c][1]
		// a start from which the whole stroke fits
		lo := 0
		if dj < 0 {
			lo = strokeLen - 1
		}
		r0 := rng.IntN(side - di*(strokeLen-1))
		c0 := lo + rng.IntN(side-(strokeLen-1)*max(dj, -dj))
		for k := range strokeLen {
			img[(r0+k*di)*side+c0+k*dj] += 1
		}
		d.labels[i] = int32(c)
	}
	return d, nil
}

// Len implements worker.Dataset.
func (d *shapes) Len() int { return len(d.labels) }

// Fill implements worker.Dataset.
func (d *shapes) Fill(idx []int, b *worker.Batch) error {
	f := d.side * d.side
	b.Reset(len(idx), f)
	for k, i := range idx {
		if i < 0 || i >= len(d.labels) {
			return fmt.Errorf("shapes: image %d of %d", i, len(d.labels))
		}
		copy(b.X[k*f:(k+1)*f], d.pixels[i*f:(i+1)*f])
		b.Labels[k] = d.labels[i]
	}
	return nil
}
