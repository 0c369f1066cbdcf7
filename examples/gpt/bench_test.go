package gpt

import (
	"math/rand/v2"
	"testing"

	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// BenchmarkStep is one training step (forward, loss, backward; no
// update) of the default model, 256 wide, 4 blocks of 4 heads, on a batch
// of 8 windows of 128 characters: samples/s is windows per second.
func BenchmarkStep(b *testing.B) {
	cfg := Config{Width: 256, Depth: 4, Heads: 4, Context: 128}
	m, err := New(cfg, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	const batch = 8
	rng := rand.New(rand.NewPCG(1, 1))
	text := make([]byte, batch*(cfg.Context+1)*4)
	for i := range text {
		text[i] = byte(32 + rng.IntN(90))
	}
	var bt worker.Batch
	if err := (&Windows{Text: text, Context: cfg.Context}).Fill([]int{0, 1, 2, 3, 4, 5, 6, 7}, &bt); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		nn.ZeroGrads(m.Params())
		if _, err := m.Step(&bt, 1./batch, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "samples/s")
}
