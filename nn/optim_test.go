package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestUpdateSaving: every optimizer of NewOptimizer is a SavingOptimizer,
// and UpdateSaving leaves bitwise the parameters and slots Update leaves,
// with the values from before the update saved — over parameters longer
// than a save block and of a length that is not a multiple of it.
func TestUpdateSaving(t *testing.T) {
	for _, cfg := range []OptimizerConfig{
		{Kind: "sgd"}, {Kind: "sgd", WeightDecay: 0.1}, {Kind: "momentum"}, {Kind: "momentum", Nesterov: true, WeightDecay: 0.01},
		{Kind: "adam"}, {Kind: "adamw", WeightDecay: 0.1},
	} {
		rng := rand.New(rand.NewPCG(1, 2))
		mk := func() ([]*Param, SavingOptimizer) {
			ps := []*Param{NewParam("a", 3*saveBlock+5), NewParam("b", 7), NewParam("c", saveBlock)}
			for _, p := range ps {
				for i := range p.Value {
					p.Value[i], p.Grad[i] = float32(math.Sin(float64(i))), float32(math.Cos(float64(3*i)))
				}
			}
			o, err := NewOptimizer(cfg, ps)
			if err != nil {
				t.Fatal(err)
			}
			so, ok := o.(SavingOptimizer)
			if !ok {
				t.Fatalf("%+v: %T is not a SavingOptimizer", cfg, o)
			}
			return ps, so
		}
		ref, refOpt := mk()
		got, gotOpt := mk()
		for step := int64(1); step <= 3; step++ {
			lr := float32(0.01 + 0.1*rng.Float64())
			var before, saved [][]float32
			for _, p := range got {
				before = append(before, append([]float32(nil), p.Value...))
				saved = append(saved, make([]float32, len(p.Value)))
			}
			for _, s := range gotOpt.Slots() {
				before = append(before, append([]float32(nil), s.Data...))
				saved = append(saved, make([]float32, len(s.Data)))
			}
			refOpt.Update(ref, lr, step)
			gotOpt.UpdateSaving(got, lr, step, saved)
			for i := range saved {
				if !bitsEqual(saved[i], before[i]) {
					t.Fatalf("%+v step %d: saved tensor %d is not what the update started from", cfg, step, i)
				}
			}
			for i, p := range got {
				if !bitsEqual(p.Value, ref[i].Value) {
					t.Fatalf("%+v step %d: parameter %s differs from Update's", cfg, step, p.Name)
				}
			}
			for i, s := range gotOpt.Slots() {
				if !bitsEqual(s.Data, refOpt.Slots()[i].Data) {
					t.Fatalf("%+v step %d: slot %s differs from Update's", cfg, step, s.Name)
				}
			}
		}
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func TestOptimizers(t *testing.T) {
	cases := []struct {
		cfg  OptimizerConfig
		want []float32 // the value after two steps of lr 0.1 from 1 with gradient 0.5
	}{
		{OptimizerConfig{Kind: "sgd"}, []float32{0.9}},
		{OptimizerConfig{Kind: "sgd", WeightDecay: 0.1}, []float32{1 - 0.1*0.6 - 0.1*(0.5+0.1*0.94)}},
		{OptimizerConfig{Kind: "momentum", Momentum: 0.5}, []float32{1 - 0.05 - 0.1*0.75}},
		{OptimizerConfig{Kind: "momentum", Momentum: 0.5, Nesterov: true}, []float32{1 - 0.1*0.75 - 0.1*(0.5+0.5*0.75)}},
		{OptimizerConfig{Kind: "adam"}, []float32{0.8}}, // bias-corrected: each step moves lr·sign(g)
		{OptimizerConfig{Kind: "adamw", WeightDecay: 0.5}, []float32{float32((1*0.95-0.1)*0.95 - 0.1)}},
	}
	for _, tc := range cases {
		p := NewParam("w", 1)
		p.Value[0] = 1
		o, err := NewOptimizer(tc.cfg, []*Param{p})
		if err != nil {
			t.Fatal(err)
		}
		for step := int64(1); step <= 2; step++ {
			p.Grad[0] = 0.5
			o.Update([]*Param{p}, 0.1, step)
		}
		if d := math.Abs(float64(p.Value[0] - tc.want[0])); d > 1e-5 {
			t.Errorf("%+v: value %v, want %v", tc.cfg, p.Value[0], tc.want[0])
		}
	}
	if _, err := NewOptimizer(OptimizerConfig{Kind: "lion"}, nil); err == nil {
		t.Error("unknown optimizer accepted")
	}
}

func TestSchedules(t *testing.T) {
	cases := []struct {
		s    Schedule
		step int64
		want float64
	}{
		{Schedule{Base: 0.1}, 1000, 0.1},
		{Schedule{Base: 0.1, Warmup: 10}, 0, 0.01},
		{Schedule{Base: 0.1, Warmup: 10}, 9, 0.1},
		{Schedule{Kind: "step", Base: 0.1, Every: 5, Gamma: 0.5}, 12, 0.025},
		{Schedule{Kind: "cosine", Base: 0.1, Total: 100}, 50, 0.05},
		{Schedule{Kind: "cosine", Base: 0.1, Total: 100, Min: 0.01}, 100, 0.01},
		{Schedule{Kind: "cosine", Base: 0.1, Warmup: 20, Total: 120}, 20, 0.1},
	}
	for _, tc := range cases {
		if err := tc.s.Validate(); err != nil {
			t.Fatalf("%+v: %v", tc.s, err)
		}
		if got := float64(tc.s.LR(tc.step)); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("%+v step %d: lr %v, want %v", tc.s, tc.step, got, tc.want)
		}
	}
	for _, bad := range []Schedule{{Base: 0}, {Base: 1, Kind: "step"}, {Base: 1, Kind: "cosine", Total: 5, Warmup: 5}, {Base: 1, Kind: "exp"}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestClipGlobalNorm(t *testing.T) {
	a, b := NewParam("a", 1), NewParam("b", 1)
	a.Grad[0], b.Grad[0] = 3, 4
	if n := ClipGlobalNorm([]*Param{a, b}, 1); n != 5 {
		t.Errorf("norm %v, want 5", n)
	}
	if math.Abs(float64(a.Grad[0])-0.6) > 1e-6 || math.Abs(float64(b.Grad[0])-0.8) > 1e-6 {
		t.Errorf("clipped to %v %v", a.Grad[0], b.Grad[0])
	}
}
