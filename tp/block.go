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
	T, heads, width := comm.Size(), b.Attention.Heads, b.Attention.Width
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

// CutBlockSequenceParallel is CutBlock with sequence parallelism: the
// block's input and output are this rank's rows (a SeqSplit before the
// first block splits them), its LayerNorms run on those rows, and each
// half gathers the rows into its column-parallel layer and
// reduce-scatters its row-parallel layer's sums back to them. The second
// result is the parameters whose gradients the caller sums across the
// group after the backward (Comm.SyncGrads): the LayerNorms' and the
// row-parallel biases.
func CutBlockSequenceParallel(comm *Comm, b *nn.Block) ([]nn.Layer, []*nn.Param, error) {
	layers, err := CutBlock(comm, b)
	if err != nil {
		return nil, nil, err
	}
	attn, mlp := layers[0].(*nn.Residual), layers[1].(*nn.Residual)
	qkv, proj := attn.Body[1].(*ColumnParallel), attn.Body[3].(*RowParallel)
	fc1, fc2 := mlp.Body[1].(*ColumnParallel), mlp.Body[3].(*RowParallel)
	for _, c := range []*ColumnParallel{qkv, fc1} {
		c.SeqParallel = true
	}
	for _, r := range []*RowParallel{proj, fc2} {
		r.SeqParallel = true
	}
	out := []nn.Layer{
		nn.NewResidual(b.LN1, NewSeqGather(comm), qkv, attn.Body[2], proj, NewSeqScatter(comm, proj.B)),
		nn.NewResidual(b.LN2, NewSeqGather(comm), fc1, mlp.Body[2], fc2, NewSeqScatter(comm, fc2.B)),
	}
	sync := []*nn.Param{b.LN1.Gain, b.LN1.Bias, b.LN2.Gain, b.LN2.Bias, proj.B, fc2.B}
	return out, sync, nil
}
