package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestCausalAttentionIsCausal: a token's output depends on its own and
// earlier tokens only (changing a later token changes nothing before it),
// sequences do not mix, and the first token's output is its own value.
func TestCausalAttentionIsCausal(t *testing.T) {
	const heads, width, seq = 2, 4, 4
	a, err := NewCausalAttention(heads, width, seq)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	x := Matrix{Rows: 2 * seq, Cols: 3 * width, Data: make([]float32, 2*seq*3*width)}
	for i := range x.Data {
		x.Data[i] = float32(rng.NormFloat64())
	}
	before := slices.Clone(a.Forward(x).Data)
	if got, want := before[:width], x.Data[2*width:3*width]; !slices.Equal(got, want) {
		t.Errorf("the first token's output %v, want its value %v", got, want)
	}
	y := slices.Clone(x.Data)
	for j := range 3 * width { // the third token of the first sequence
		y[2*3*width+j] += 1
	}
	after := a.Forward(Matrix{Rows: x.Rows, Cols: x.Cols, Data: y}).Data
	for i := range before {
		tok := i / width
		changed := before[i] != after[i]
		if shouldChange := tok >= 2 && tok < seq; changed && !shouldChange {
			t.Errorf("token %d's output changed when token 2 of sequence 0 did", tok)
		}
	}
	if _, err := NewCausalAttention(3, 4, 2); err == nil {
		t.Error("3 heads over 4 features accepted")
	}
}

// TestCausalAttentionInputGradient: the core's input gradient, queries,
// keys and values each, against central differences of Σ y ⊙ r, with
// inputs large enough that the attention weights are far from uniform
// (so that the keys' and queries' gradients are not small).
func TestCausalAttentionInputGradient(t *testing.T) {
	const heads, width, seq = 2, 4, 3
	a, err := NewCausalAttention(heads, width, seq)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	rows := 2 * seq
	x := make([]float64, rows*3*width)
	for i := range x {
		x[i] = 1.5 * rng.NormFloat64()
	}
	r := Matrix{Rows: rows, Cols: width, Data: make([]float32, rows*width)}
	for i := range r.Data {
		r.Data[i] = float32(rng.NormFloat64())
	}
	f := func(x []float64) float64 {
		m := Matrix{Rows: rows, Cols: 3 * width, Data: make([]float32, len(x))}
		for i, v := range x {
			m.Data[i] = float32(v)
		}
		var s float64
		for i, v := range a.Forward(m).Data {
			s += float64(v) * float64(r.Data[i])
		}
		return s
	}
	f(x)
	dx := slices.Clone(a.Backward(r).Data)
	var part [3]float64 // the largest gradient of Q, K and V
	for i := range x {
		orig := x[i]
		const h = 1e-2
		x[i] = orig + h
		up := f(x)
		x[i] = orig - h
		down := f(x)
		x[i] = orig
		num := (up - down) / (2 * h)
		k := (i % (3 * width)) / width
		part[k] = max(part[k], math.Abs(num))
		if d := math.Abs(num - float64(dx[i])); d > 1e-3+1e-2*math.Abs(num) {
			t.Errorf("input %d (%s): analytic %.5f, numeric %.5f", i, [3]string{"q", "k", "v"}[k], dx[i], num)
		}
	}
	for k, m := range part {
		if m < 0.05 {
			t.Errorf("the %s gradients are at most %.4f: too small to check", [3]string{"q", "k", "v"}[k], m)
		}
	}
}
