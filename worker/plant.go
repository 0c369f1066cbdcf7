package worker

import "github.com/phalanx-rt/phalanx/internal/plant"

// plantSamples is where the planted sample bugs strike (see internal/plant):
// rank 1's share of step 40 loses its last sample, or trains its first one
// twice in its place.
func plantSamples(idx []int, step int64, rank int) []int {
	if step != 40 || rank != 1 || len(idx) < 2 {
		return idx
	}
	switch {
	case plant.On(plant.SkipSample):
		return idx[:len(idx)-1]
	case plant.On(plant.DupSample):
		idx[len(idx)-1] = idx[0]
	}
	return idx
}
