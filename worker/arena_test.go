package worker

import (
	"math"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/nn"
)

// TestGradArenaLayout: gradients move into one buffer in reverse parameter
// order with their values kept, and are cut into chunks at parameter
// boundaries, each closed at a bucket's bytes; the statistics end the last
// chunk, or have one of their own.
func TestGradArenaLayout(t *testing.T) {
	sizes := []int{100, 10, 300, 20, 5} // parameters 0..4; backward order 4, 3, 2, 1, 0
	cases := []struct {
		name        string
		bucketBytes int
		apart       bool
		bounds      []int // in elements
		chunkOf     []int // by parameter
	}{
		{"one bucket", 1 << 20, false, []int{0, 435 + statsLen}, []int{0, 0, 0, 0, 0}},
		{"bucket per 100 bytes", 100, false, []int{0, 25, 325, 435 + statsLen}, []int{2, 2, 1, 0, 0}},
		{"statistics apart", 1 << 20, true, []int{0, 435, 435 + statsLen}, []int{0, 0, 0, 0, 0}},
		{"bucket per element", 1, true, []int{0, 5, 25, 325, 335, 435, 435 + statsLen}, []int{4, 3, 2, 1, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			params := make([]*nn.Param, len(sizes))
			for i, n := range sizes {
				params[i] = nn.NewParam("p", n)
				for k := range params[i].Grad {
					params[i].Grad[k] = float32(i*1000 + k)
				}
			}
			a := newGradArena(params, tc.bucketBytes, tc.apart)
			if !slices.Equal(a.bounds, tc.bounds) || !slices.Equal(a.chunkOf, tc.chunkOf) {
				t.Fatalf("bounds %v, chunks of parameters %v; want %v, %v", a.bounds, a.chunkOf, tc.bounds, tc.chunkOf)
			}
			at := 0
			for i := len(params) - 1; i >= 0; i-- {
				g := params[i].Grad
				if len(g) != sizes[i] || &g[0] != &a.buf[at] {
					t.Fatalf("parameter %d's gradient is not at %d in the arena", i, at)
				}
				for k, v := range g {
					if v != float32(i*1000+k) {
						t.Fatalf("parameter %d element %d: %v, the old gradient lost", i, k, v)
					}
				}
				at += len(g)
			}
			n := 0
			for k, c := range a.chunks {
				n += a.params[k]
				if unsafe.SliceData(c) != &a.buf[a.bounds[k]] {
					t.Fatalf("chunk %d is not a view of the arena", k)
				}
			}
			if n != len(params) || len(a.tail()) != statsLen {
				t.Fatalf("%d parameters counted in chunks, tail of %d", n, len(a.tail()))
			}
		})
	}
}

// TestTrainerWire: with gradients travelling as float16 or bfloat16, ranks
// stay bitwise identical, the statistics stay exact (the fingerprint of the
// whole global batch), and training follows the float32 run closely; a wire
// type the Fuser refuses is refused by NewTrainer.
func TestTrainerWire(t *testing.T) {
	ctx := testContext(t)
	run := func(t *testing.T, cfg Config, steps int) ([]*Trainer, []StepStats) {
		groups, err := collective.InprocGroups(ctx, 2, "wire", 1, collective.Options{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { collective.CloseGroups(groups) })
		data := newBlobs(600)
		ranks := make([]*Trainer, 2)
		for r, g := range groups {
			m := newTinyModel()
			opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum"}, m.Params())
			if ranks[r], err = NewTrainer(ctx, g, m, data, opt, cfg, nil); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ranks[r].Close)
		}
		var last []StepStats
		for range steps {
			last = make([]StepStats, 2)
			errs := make([]error, 2)
			done := make(chan int)
			for r, tr := range ranks {
				go func() { last[r], errs[r] = tr.Step(ctx); done <- r }()
			}
			testwait.Recv(t, done, time.Minute, "a rank's step")
			testwait.Recv(t, done, time.Minute, "the other rank's step")
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		return ranks, last
	}
	base := Config{GlobalBatch: 60, BucketBytes: 128, Schedule: nn.Schedule{Base: 0.05}, Seed: 4}
	_, ref := run(t, base, 20)
	for _, tc := range []struct {
		name     string
		wire     collective.DType
		feedback bool
	}{{"float16", collective.Float16, false}, {"bfloat16", collective.BFloat16, false}, {"float16 with error feedback", collective.Float16, true}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.Wire, cfg.ErrorFeedback = tc.wire, tc.feedback
			ranks, last := run(t, cfg, 20)
			if !sameBits(paramsOf(ranks[0]), paramsOf(ranks[1])) {
				t.Fatal("ranks' parameters differ")
			}
			// Step 20's global batch (the last of epoch 1): the sampler's, exactly.
			idx, _, _, err := ranks[0].sampler.Batch(Position{Epoch: 1, Offset: 540}, 60, 1, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if last[0].Fingerprint != FingerprintOf(idx) || last[0].Samples != 60 {
				t.Fatalf("fingerprint %v over %d samples, want %v over 60", last[0].Fingerprint, last[0].Samples, FingerprintOf(idx))
			}
			if d := math.Abs(last[0].Loss - ref[0].Loss); d > 0.02*ref[0].Loss {
				t.Fatalf("loss %v after 20 steps, float32 gives %v", last[0].Loss, ref[0].Loss)
			}
		})
	}
	cfg := base
	cfg.Wire = collective.Float64
	groups, err := collective.InprocGroups(ctx, 1, "wire-bad", 1, collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer collective.CloseGroups(groups)
	m := newTinyModel()
	opt, _ := nn.NewOptimizer(nn.OptimizerConfig{}, m.Params())
	if _, err := NewTrainer(ctx, groups[0], m, newBlobs(10), opt, cfg, nil); err == nil {
		t.Fatal("a float64 wire for float32 gradients was accepted")
	}
}
