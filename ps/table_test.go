package ps

import (
	"math"
	"slices"
	"testing"
)

func TestRowsInitDeterministic(t *testing.T) {
	for _, init := range []InitKind{InitZeros, InitUniform, InitNormal} {
		spec := TableSpec{Name: "e", Dim: 5, Init: init, InitScale: 0.5, Seed: 42, LR: 0.1}
		if err := spec.Validate(); err != nil {
			t.Fatal(err)
		}
		a, b := NewRows(spec), NewRows(spec)
		keys := []uint64{3, 1 << 50, 3, 7}
		out1, out2 := make([]float32, 4*5), make([]float32, 4*5)
		a.Pull(keys, out1)
		rev := []uint64{7, 3, 1 << 50, 3}
		b.Pull(rev, out2)
		if !slices.Equal(out1[:5], out2[5:10]) || !slices.Equal(out1[15:], out2[:5]) || a.Len() != 3 || b.Len() != 3 {
			t.Fatalf("%v: rows differ with creation order, or repeated keys created twice", init)
		}
		if init == InitZeros {
			continue
		}
		if slices.Equal(out1[:5], out1[15:]) {
			t.Errorf("%v: keys 3 and 7 start equal", init)
		}
		for _, v := range out1 {
			if init == InitUniform && (v < -0.5 || v >= 0.5) || math.IsNaN(float64(v)) {
				t.Errorf("%v: initial value %v out of range", init, v)
			}
		}
	}
}

// TestOptimizers checks each optimizer's update of one row against its
// formula, over two steps (Adam's bias correction uses the row's own count).
func TestOptimizers(t *testing.T) {
	g1, g2 := []float32{1, -2}, []float32{0.5, 0.5}
	cases := []struct {
		kind OptimizerKind
		want func(w0 float64, g []float64) float64 // one coordinate after g[0], g[1]
	}{
		{SGD, func(w float64, g []float64) float64 { return w - 0.1*g[0] - 0.1*g[1] }},
		{Adagrad, func(w float64, g []float64) float64 {
			acc := 0.1
			for _, x := range g {
				acc += x * x
				w -= 0.1 * x / (math.Sqrt(acc) + 1e-10)
			}
			return w
		}},
		{Adam, func(w float64, g []float64) float64 {
			m, v := 0.0, 0.0
			for i, x := range g {
				m = 0.9*m + 0.1*x
				v = 0.999*v + 0.001*x*x
				t := float64(i + 1)
				w -= 0.1 * (m / (1 - math.Pow(0.9, t))) / (math.Sqrt(v/(1-math.Pow(0.999, t))) + 1e-8)
			}
			return w
		}},
	}
	for _, tc := range cases {
		spec := TableSpec{Name: "w", Dim: 2, Init: InitUniform, InitScale: 1, Optimizer: tc.kind, LR: 0.1}
		if err := spec.Validate(); err != nil {
			t.Fatal(err)
		}
		r := NewRows(spec)
		w0 := make([]float32, 2)
		r.Pull([]uint64{9}, w0)
		r.Apply([]uint64{9}, g1, 1)
		r.Apply([]uint64{9}, []float32{g2[0] * 2, g2[1] * 2}, 0.5) // scale applies to the gradient
		got := make([]float32, 2)
		r.Pull([]uint64{9}, got)
		for j := range 2 {
			want := tc.want(float64(w0[j]), []float64{float64(g1[j]), float64(g2[j])})
			if math.Abs(float64(got[j])-want) > 1e-5 {
				t.Errorf("%v coordinate %d: %v, want %v", tc.kind, j, got[j], want)
			}
		}
	}
}

func TestRowsManyAndLoad(t *testing.T) {
	spec := TableSpec{Name: "big", Dim: 3, Init: InitNormal, InitScale: 0.1, Optimizer: Adam, LR: 0.01}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	r := NewRows(spec)
	const n = 3<<chunkShift + 5 // several chunks
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = uint64(i) * 7919
	}
	grads := make([]float32, n*3)
	for i := range grads {
		grads[i] = float32(i%11) - 5
	}
	r.Apply(keys, grads, 1)
	if r.Len() != n {
		t.Fatalf("%d rows, want %d", r.Len(), n)
	}
	c := NewRows(spec)
	r.Each(func(k uint64, row []float32) {
		if err := c.Load(k, row); err != nil {
			t.Fatal(err)
		}
	})
	a, b := make([]float32, n*3), make([]float32, n*3)
	r.Pull(keys, a)
	c.Pull(keys, b)
	if !slices.Equal(a, b) {
		t.Fatal("rows loaded from Each differ")
	}
	r.Apply(keys[:1], grads[:3], 1)
	c.Apply(keys[:1], grads[:3], 1)
	r.Pull(keys[:1], a[:3])
	c.Pull(keys[:1], b[:3])
	if !slices.Equal(a[:3], b[:3]) {
		t.Fatal("optimizer state not carried by Each and Load")
	}
	if err := c.Load(1, make([]float32, 2)); err == nil {
		t.Error("a short row loaded")
	}
}

func TestTableSpecValidate(t *testing.T) {
	for _, s := range []TableSpec{
		{Name: "a", Dim: 0, LR: 1},
		{Name: "b", Dim: 1, LR: 0},
		{Name: "c", Dim: 1, LR: float32(math.Inf(1))},
		{Name: "d", Dim: 1, LR: 1, Optimizer: 9},
		{Name: "e", Dim: 1, LR: 1, Beta1: 1.5},
	} {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v validated", s)
		}
	}
	dense := TableSpec{Name: "w", Dim: 1, LR: 1, Rows: 10}
	if dense.CheckKey(9) != nil || dense.CheckKey(10) == nil {
		t.Error("dense key bounds")
	}
	if _, err := ParseOptimizer("rmsprop"); err == nil {
		t.Error("rmsprop parsed")
	}
}
