package nn

import (
	"math"
	"testing"
)

// TestFastMath: Exp32 within 3 float32 ulps (relative 3.6e-7) of math.Exp
// over its whole range, and tanh32 within 2e-7 of math.Tanh, on a dense
// grid and at the edges.
func TestFastMath(t *testing.T) {
	for _, tc := range []struct {
		name   string
		f      func(float32) float32
		ref    func(float64) float64
		lo, hi float64
		bound  func(ref float64) float64 // the error allowed at ref
	}{
		{"Exp32", Exp32, math.Exp, -87, 88.7, func(r float64) float64 { return 3.6e-7 * r }},
		{"tanh32", tanh32, math.Tanh, -12, 12, func(float64) float64 { return 2e-7 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 1 << 20
			worst, at := 0.0, 0.0
			for i := 0; i <= n; i++ {
				x := float32(tc.lo + (tc.hi-tc.lo)*float64(i)/n)
				ref := tc.ref(float64(x))
				got := float64(tc.f(x))
				if e := math.Abs(got - ref); e > tc.bound(math.Abs(ref)) && e/tc.bound(math.Abs(ref)) > worst {
					worst, at = e/tc.bound(math.Abs(ref)), float64(x)
				}
			}
			if worst > 0 {
				t.Errorf("%s(%g) is %g times its error bound off", tc.name, at, worst)
			}
		})
	}
	for _, c := range []struct {
		got, want float32
	}{{Exp32(0), 1}, {Exp32(-100), 0}, {Exp32(100), float32(math.Inf(1))}, {tanh32(0), 0}, {tanh32(20), 1}, {tanh32(-20), -1}} {
		if c.got != c.want {
			t.Errorf("got %v, want %v", c.got, c.want)
		}
	}
}

func BenchmarkTanh(b *testing.B) {
	xs := make([]float32, 4096)
	for i := range xs {
		xs[i] = float32(i-2048) / 512
	}
	b.Run("math", func(b *testing.B) {
		var s float32
		for range b.N {
			for _, x := range xs {
				s += float32(math.Tanh(float64(x)))
			}
		}
		_ = s
	})
	b.Run("tanh32s", func(b *testing.B) {
		dst := make([]float32, len(xs))
		for range b.N {
			tanh32s(dst, xs)
		}
	})
}
