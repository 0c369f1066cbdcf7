package pipeline

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/pipeline/cut"
	"github.com/phalanx-rt/phalanx/nn"
)

// measure times each layer's forward and backward pass on a micro-batch
// of rows random inputs, the best of runs, in seconds.
func measure(m *Model, o job.Options, seed uint64, layers []Layer, rows, runs int) ([]float64, error) {
	built, err := m.Build(o, seed, 0, len(layers))
	if err != nil {
		return nil, fmt.Errorf("pipeline: building model to time its layers: %w", err)
	}
	rng := rand.New(rand.NewPCG(seed, 11))
	cost := make([]float64, len(layers))
	for i, l := range built {
		x := make([]float32, rows*layers[i].In)
		dy := make([]float32, rows*layers[i].Out)
		for j := range x {
			if i > 0 || m.SampleRows == nil { // a sequence model's first layer reads token ids: zeros
				x[j] = float32(rng.NormFloat64())
			}
		}
		for j := range dy {
			dy[j] = float32(rng.NormFloat64())
		}
		best := time.Duration(1 << 62)
		for range runs {
			t := time.Now()
			l.Forward(nn.Matrix{Rows: rows, Cols: layers[i].In, Data: x})
			l.Backward(nn.Matrix{Rows: rows, Cols: layers[i].Out, Data: dy})
			best = min(best, time.Since(t))
		}
		cost[i] = best.Seconds()
	}
	return cost, nil
}

// cutByCost cuts layers into parts of even measured cost.
func cutByCost(layers []Layer, cost []float64, parts int) ([]int, error) {
	c, err := cut.ByCost(cutLayers(layers, cost), parts)
	if err != nil {
		return nil, job.Invalid("Pipeline.Stages", parts, "%v", err)
	}
	return c, nil
}
