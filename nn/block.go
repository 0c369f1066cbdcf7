package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Block is GPT-2's pre-norm transformer block over sequences of Seq
// tokens of Width features:
//
//	h = x + Proj(Attention(QKV(LN1(x))))
//	y = h + FC2(GELU(FC1(LN2(h))))
//
// with causal multi-head attention of Heads heads and an MLP four times
// as wide. Its pieces are exported so that a tensor-parallel block can cut
// them; Layers is the block as two Residual layers.
type Block struct {
	LN1       *LayerNorm
	QKV       *Dense // Width → 3·Width: Q, then K, then V
	Attention *CausalAttention
	Proj      *Dense // Width → Width
	LN2       *LayerNorm
	FC1       *Dense // Width → 4·Width
	FC2       *Dense // 4·Width → Width
}

// NewBlock makes block name (its parameters named name.ln1.gain,
// name.qkv.W and so on) with GPT-2's initialisation: weights N(0, 0.02²),
// the two projections into the residual stream (Proj, FC2) scaled by
// 1/√(2·depth) for a model of depth blocks, biases zero. heads must
// divide width.
func NewBlock(name string, heads, width, seq, depth int, rng *rand.Rand) (*Block, error) {
	at, err := NewCausalAttention(heads, width, seq)
	if err != nil {
		return nil, fmt.Errorf("nn: block %s: %w", name, err)
	}
	if depth < 1 {
		return nil, fmt.Errorf("nn: block %s of a model of depth %d", name, depth)
	}
	deep := 0.02 / math.Sqrt(float64(2*depth))
	return &Block{
		LN1:       NewLayerNorm(name+".ln1", width),
		QKV:       NewDenseNormal(name+".qkv", width, 3*width, 0.02, rng),
		Attention: at,
		Proj:      NewDenseNormal(name+".proj", width, width, deep, rng),
		LN2:       NewLayerNorm(name+".ln2", width),
		FC1:       NewDenseNormal(name+".fc1", width, 4*width, 0.02, rng),
		FC2:       NewDenseNormal(name+".fc2", 4*width, width, deep, rng),
	}, nil
}

// Layers is the block as two Residual layers, attention then MLP.
func (b *Block) Layers() []Layer {
	return []Layer{
		NewResidual(b.LN1, b.QKV, b.Attention, b.Proj),
		NewResidual(b.LN2, b.FC1, &GELU{}, b.FC2),
	}
}

// NewDenseNormal makes a Dense layer with N(0, std²) weights drawn from
// rng and zero bias.
func NewDenseNormal(name string, in, out int, std float64, rng *rand.Rand) *Dense {
	d := &Dense{W: NewParam(name+".W", in, out), B: NewParam(name+".b", out), in: in, out: out}
	for i := range d.W.Value {
		d.W.Value[i] = float32(std * rng.NormFloat64())
	}
	return d
}
