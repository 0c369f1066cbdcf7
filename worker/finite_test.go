package worker

import (
	"errors"
	"math"
	"testing"

	"github.com/phalanx-rt/phalanx/nn"
)

// TestCheckFinite: every non-finite value is found wherever it sits (in a
// block of four or in the tail) and named by parameter and element; no
// finite value, however large or small, is taken for one, even by the fast
// pass alone (a false alarm there would cost every step the slow search).
func TestCheckFinite(t *testing.T) {
	nan := math.Float32frombits(0x7fc00001)
	for _, tc := range []struct {
		name  string
		value float32
		bad   bool
	}{
		{"largest finite", math.MaxFloat32, false},
		{"most negative finite", -math.MaxFloat32, false},
		{"smallest subnormal", math.Float32frombits(1), false},
		{"negative zero", float32(math.Copysign(0, -1)), false},
		{"+Inf", float32(math.Inf(1)), true},
		{"-Inf", float32(math.Inf(-1)), true},
		{"quiet NaN", nan, true},
		{"signalling NaN", math.Float32frombits(0x7f800001), true},
		{"negative NaN", math.Float32frombits(0xffc00000), true},
	} {
		for _, at := range []struct{ param, index int }{{0, 0}, {0, 5}, {1, 7}, {1, 9}} {
			params := []*nn.Param{{Name: "a", Grad: make([]float32, 6)}, {Name: "b", Grad: make([]float32, 10)}}
			for _, p := range params {
				for i := range p.Grad {
					p.Grad[i] = float32(i) - 3.5
				}
			}
			params[at.param].Grad[at.index] = tc.value
			if got := allFinite(params); got == tc.bad {
				t.Fatalf("%s at %s[%d]: the fast pass says finite %v", tc.name, params[at.param].Name, at.index, got)
			}
			err := checkFinite(params, 7)
			var nf *NonFiniteError
			switch {
			case !tc.bad && err != nil:
				t.Fatalf("%s at %s[%d]: %v, want none", tc.name, params[at.param].Name, at.index, err)
			case tc.bad && !errors.As(err, &nf):
				t.Fatalf("%s at %s[%d]: %v, want a NonFiniteError", tc.name, params[at.param].Name, at.index, err)
			case tc.bad && (nf.Param != params[at.param].Name || nf.Index != at.index || nf.Step != 7):
				t.Fatalf("%s at %s[%d]: the error names %s[%d] of step %d", tc.name, params[at.param].Name, at.index, nf.Param, nf.Index, nf.Step)
			}
		}
	}
}
