//go:build phalanx_plant

package worker

import (
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/internal/plant"
)

// TestPlantedSamplerDup: the check behind TestSamplerExactlyOnce catches a
// sampler that deals one sample twice and another never, in epoch 1 only
// (the planted bug SamplerDup), which a check of epoch 0 alone did not.
func TestPlantedSamplerDup(t *testing.T) {
	t.Setenv(plant.Env, string(plant.SamplerDup))
	s, err := NewSampler(1003, 42)
	if err != nil {
		t.Fatal(err)
	}
	err = dealtExactlyOnce(s, 64, 4, func(int) int { return 3 })
	if err == nil || !strings.HasPrefix(err.Error(), "epoch 1: sample ") {
		t.Fatalf("with %s planted: %v; want epoch 1's sample dealt twice or never", plant.SamplerDup, err)
	}
	t.Log(err)
}
