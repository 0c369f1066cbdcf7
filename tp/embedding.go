package tp

import (
	"fmt"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// VocabParallelEmbedding is an embedding table split by vocabulary, as
// Megatron-LM's: each rank holds rows [lo, hi) (collective.ShardRange of
// the vocabulary) and looks up the ids it holds, zeros for the others; the
// rows are summed across the group (g), so every rank has every id's row.
// The backward is the identity across the group: each rank adds the
// gradient of the ids it holds into its rows.
type VocabParallelEmbedding struct {
	Table  *nn.Param // rows [lo, hi) of the whole table
	comm   *Comm
	vocab  int
	dim    int
	lo, hi int
	ids    []int32
	y      []float32
}

// NewVocabParallelEmbedding cuts full (the same on every rank) by rows.
func NewVocabParallelEmbedding(comm *Comm, full *nn.Embedding) *VocabParallelEmbedding {
	vocab, dim := full.Table.Shape[0], full.Table.Shape[1]
	lo, hi := collective.ShardRange(vocab, comm.Size(), comm.Rank())
	t := nn.NewParam(full.Table.Name, hi-lo, dim)
	copy(t.Value, full.Table.Value[lo*dim:hi*dim])
	return &VocabParallelEmbedding{Table: t, comm: comm, vocab: vocab, dim: dim, lo: lo, hi: hi}
}

// Range is the vocabulary rows this rank holds.
func (e *VocabParallelEmbedding) Range() (lo, hi int) { return e.lo, e.hi }

func (e *VocabParallelEmbedding) Params() []*nn.Param { return []*nn.Param{e.Table} }

// Lookup returns one row per id, on every rank; an id outside the
// vocabulary is an error (before any communication: every rank has the
// same ids).
func (e *VocabParallelEmbedding) Lookup(ids []int32) (nn.Matrix, error) {
	for i, id := range ids {
		if id < 0 || int(id) >= e.vocab {
			return nn.Matrix{}, fmt.Errorf("tp: %s: id %d at position %d outside a vocabulary of %d", e.Table.Name, id, i, e.vocab)
		}
	}
	y := nn.Matrix{Rows: len(ids), Cols: e.dim, Data: grow(&e.y, len(ids)*e.dim)}
	for i, id := range ids {
		row := y.Data[i*e.dim : (i+1)*e.dim]
		if int(id) >= e.lo && int(id) < e.hi {
			copy(row, e.Table.Value[(int(id)-e.lo)*e.dim:(int(id)-e.lo+1)*e.dim])
		} else {
			clear(row)
		}
	}
	e.comm.allReduce("vocabulary-parallel embedding", y.Data) // g
	e.ids = ids
	return y, e.comm.Err()
}

// Backward adds dy's rows into the rows this rank holds of the looked-up
// ids.
func (e *VocabParallelEmbedding) Backward(dy nn.Matrix) {
	for i, id := range e.ids {
		if int(id) < e.lo || int(id) >= e.hi {
			continue
		}
		g := e.Table.Grad[(int(id)-e.lo)*e.dim : (int(id)-e.lo+1)*e.dim]
		for j, v := range dy.Data[i*e.dim : (i+1)*e.dim] {
			g[j] += v
		}
	}
}
