package tp

import (
	"fmt"

	"github.com/phalanx-rt/phalanx/nn"
)

// CutBlock cuts a pre-norm transformer block (the same on every rank)
// across the group, as Megatron-LM does: each rank keeps the attention of
// heads/T heads (the [Q | K | V] projection cut by heads, column-parallel
// behind f; the output projection row-parallel behind g) and a 1/T range
// of the MLP's hidden features (FC1 column-parallel, FC2 row-parallel).
// The LayerNorms stay whole on every rank. Its layers are the block's two
// Residuals; the group must divide the heads.
func CutBlock(comm *Comm, b *nn.Block) ([]nn.Layer, error) {
	T, heads, width := comm.G.Size(), b.Attention.Heads, b.Attention.Width
	if heads%T != 0 {
		return nil, fmt.Errorf("tp: %d heads do not split across %d tensor-parallel ranks: the ranks must divide the heads", heads, T)
	}
	qkv, err := NewColumnParallelBlocks(comm, b.QKV, 3)
	if err != nil {
		return nil, err
	}
	qkv.Local.SkipInputGrad = false
	at, err := nn.NewCausalAttention(heads/T, width/T, b.Attention.Seq)
	if err != nil {
		return nil, err
	}
	fc1 := NewColumnParallel(comm, b.FC1, false)
	return []nn.Layer{
		nn.NewResidual(b.LN1, qkv, at, NewRowParallel(comm, b.Proj, true)),
		nn.NewResidual(b.LN2, fc1, &nn.GELU{}, NewRowParallel(comm, b.FC2, true)),
	}, nil
}
