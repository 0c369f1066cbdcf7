package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// net is a tiny model under test: optional embedding, then layers, then the
// loss; input is its own parameter so the input gradient is checked too.
type net struct {
	emb    *Embedding
	ids    []int32
	input  *Param
	rows   int
	seq    *Sequential
	loss   SoftmaxCrossEntropy
	labels []int32
}

func (n *net) params() []*Param {
	ps := append([]*Param(nil), n.seq.Params()...)
	if n.emb != nil {
		ps = append(ps, n.emb.Table)
	} else {
		ps = append(ps, n.input)
	}
	return ps
}

// run returns the loss and, when backward, leaves the gradients in the params.
func (n *net) run(t *testing.T, backward bool) float64 {
	var x Matrix
	if n.emb != nil {
		var err error
		if x, err = n.emb.Lookup(n.ids); err != nil {
			t.Fatal(err)
		}
	} else {
		x = Matrix{Rows: n.rows, Cols: len(n.input.Value) / n.rows, Data: n.input.Value}
	}
	logits := n.seq.Forward(x)
	const scale = 0.25
	sum, _, grad, err := n.loss.Loss(logits, n.labels, scale)
	if err != nil {
		t.Fatal(err)
	}
	if backward {
		ZeroGrads(n.params())
		dx := n.seq.Backward(grad, nil)
		if n.emb != nil {
			n.emb.Backward(dx)
		} else {
			copy(n.input.Grad, dx.Data)
		}
	}
	return sum * scale
}

func TestGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	labels := func(n, classes int) []int32 {
		l := make([]int32, n)
		for i := range l {
			l[i] = int32(rng.IntN(classes))
		}
		return l
	}
	input := func(rows, cols int) *Param {
		p := NewParam("input", rows, cols)
		for i := range p.Value {
			p.Value[i] = float32(rng.NormFloat64())
		}
		return p
	}
	dense := func(name string, in, out int) *Dense {
		d := NewDense(name, in, out, rng)
		for i := range d.B.Value {
			d.B.Value[i] = float32(rng.NormFloat64() * 0.1)
		}
		return d
	}
	cases := []struct {
		name string
		net  func() *net
	}{
		{"dense", func() *net {
			d := dense("d", 5, 4)
			s := NewSequential(d)
			d.SkipInputGrad = false
			return &net{input: input(3, 5), rows: 3, seq: s, labels: labels(3, 4)}
		}},
		{"dense-relu-dense", func() *net {
			d := dense("d1", 6, 8)
			s := NewSequential(d, &ReLU{}, dense("d2", 8, 3))
			d.SkipInputGrad = false
			return &net{input: input(4, 6), rows: 4, seq: s, labels: labels(4, 3)}
		}},
		{"dense-layernorm-gelu-dense", func() *net {
			d := dense("d1", 6, 8)
			ln := NewLayerNorm("ln", 8)
			for i := range ln.Gain.Value { // not the identity: every parameter's gradient shows
				ln.Gain.Value[i] = float32(1 + 0.3*rng.NormFloat64())
				ln.Bias.Value[i] = float32(0.2 * rng.NormFloat64())
			}
			s := NewSequential(d, ln, &GELU{}, dense("d2", 8, 3))
			d.SkipInputGrad = false
			return &net{input: input(4, 6), rows: 4, seq: s, labels: labels(4, 3)}
		}},
		{"causal-attention", func() *net {
			// two sequences of 3 tokens, width 4 in 2 heads: Q, K, V from a
			// Dense, the core, a Dense to 3 classes
			qkv := dense("qkv", 5, 12)
			at, err := NewCausalAttention(2, 4, 3)
			if err != nil {
				t.Fatal(err)
			}
			s := NewSequential(qkv, at, dense("out", 4, 3))
			qkv.SkipInputGrad = false
			return &net{input: input(6, 5), rows: 6, seq: s, labels: labels(6, 3)}
		}},
		{"positions-attention", func() *net {
			// learned positions on the input of the causal core's Dense
			pos := NewPositions("pos", 3, 5, rng)
			qkv := dense("qkv", 5, 12)
			at, err := NewCausalAttention(2, 4, 3)
			if err != nil {
				t.Fatal(err)
			}
			for i := range pos.Table.Value { // large enough to matter
				pos.Table.Value[i] = float32(rng.NormFloat64())
			}
			s := NewSequential(pos, qkv, at, dense("out", 4, 3))
			return &net{input: input(6, 5), rows: 6, seq: s, labels: labels(6, 3)}
		}},
		{"pre-norm-block", func() *net {
			// GPT-2's block over two sequences of 3 tokens, width 4 in 2
			// heads: x + proj(attention(qkv(LN(x)))), then
			// x + fc2(GELU(fc1(LN(x)))), then a Dense to 3 classes
			norm := func(name string) *LayerNorm {
				ln := NewLayerNorm(name, 4)
				for i := range ln.Gain.Value {
					ln.Gain.Value[i] = float32(1 + 0.3*rng.NormFloat64())
					ln.Bias.Value[i] = float32(0.2 * rng.NormFloat64())
				}
				return ln
			}
			at, err := NewCausalAttention(2, 4, 3)
			if err != nil {
				t.Fatal(err)
			}
			attn := NewResidual(norm("ln1"), dense("qkv", 4, 12), at, dense("proj", 4, 4))
			mlp := NewResidual(norm("ln2"), dense("fc1", 4, 8), &GELU{}, dense("fc2", 8, 4))
			s := NewSequential(attn, mlp, dense("out", 4, 3))
			return &net{input: input(6, 4), rows: 6, seq: s, labels: labels(6, 3)}
		}},
		{"embedding-dense", func() *net {
			e := NewEmbedding("e", 7, 4, rng)
			d := dense("d", 4, 5)
			s := NewSequential(d)
			d.SkipInputGrad = false
			return &net{emb: e, ids: []int32{1, 3, 3, 6, 0}, seq: s, labels: labels(5, 5)}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.net()
			n.run(t, true)
			for _, p := range n.params() {
				analytic := append([]float32(nil), p.Grad...)
				for i := range p.Value {
					orig := p.Value[i]
					const h = 1e-2
					p.Value[i] = orig + h
					up := n.run(t, false)
					p.Value[i] = orig - h
					down := n.run(t, false)
					p.Value[i] = orig
					numeric := (up - down) / (2 * h)
					if d := math.Abs(numeric - float64(analytic[i])); d > 2e-3+2e-2*math.Abs(numeric) {
						t.Errorf("%s[%d]: analytic %.6f, numeric %.6f", p.Name, i, analytic[i], numeric)
					}
				}
			}
		})
	}
}

func TestLossRejectsBadLabels(t *testing.T) {
	var l SoftmaxCrossEntropy
	if _, _, _, err := l.Loss(Matrix{Rows: 1, Cols: 3, Data: make([]float32, 3)}, []int32{3}, 1); err == nil {
		t.Error("label 3 of 3 classes accepted")
	}
	e := NewEmbedding("e", 4, 2, rand.New(rand.NewPCG(1, 1)))
	if _, err := e.Lookup([]int32{4}); err == nil {
		t.Error("id 4 of a vocabulary of 4 accepted")
	}
}
