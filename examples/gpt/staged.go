package gpt

import (
	"fmt"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// Staged is the gpt's pipeline form (ModelSpec.Impl), which a pipeline
// job (--pp P) cuts into stages: the layers are the token embedding, the
// learned positions, each block's attention half and MLP half, the final
// LayerNorm and the head, over rows that are tokens (SampleRows: a
// window's context), so that a window's tokens stay in one micro-batch
// for the attention. Its parameters are the ring's and the split model's,
// by name, so a checkpoint of any of the three forms resumes in the
// others. Each stage builds the whole model from the seed and keeps its
// layers.
func Staged() *phalanx.PipelineModel {
	return &phalanx.PipelineModel{Layers: stagedLayers, Build: buildStaged, Data: stagedData, Measures: Measures,
		SampleRows: func(o phalanx.Options) int {
			cfg, _, err := options(o)
			if err != nil {
				return 1 // Layers refuses the options first
			}
			return cfg.Context
		}}
}

// stagedLayers: tok (a token id a row, 1 → d), pos, h<i>.attn and
// h<i>.mlp for each block, lnf, head (d → the vocabulary).
func stagedLayers(o phalanx.Options) ([]phalanx.PipelineLayer, error) {
	cfg, _, err := options(o)
	if err != nil {
		return nil, err
	}
	d := int64(cfg.Width)
	ls := []phalanx.PipelineLayer{{Name: "tok", Params: Vocab * d, In: 1, Out: cfg.Width},
		{Name: "pos", Params: int64(cfg.Context) * d, In: cfg.Width, Out: cfg.Width}}
	for i := range cfg.Depth {
		ls = append(ls, phalanx.PipelineLayer{Name: fmt.Sprintf("h%d.attn", i), Params: 2*d + 3*d*d + 3*d + d*d + d, In: cfg.Width, Out: cfg.Width},
			phalanx.PipelineLayer{Name: fmt.Sprintf("h%d.mlp", i), Params: 2*d + 4*d*d + 4*d + 4*d*d + d, In: cfg.Width, Out: cfg.Width})
	}
	return append(ls, phalanx.PipelineLayer{Name: "lnf", Params: 2 * d, In: cfg.Width, Out: cfg.Width},
		phalanx.PipelineLayer{Name: "head", Params: d*Vocab + Vocab, In: cfg.Width, Out: Vocab}), nil
}

// buildStaged builds the whole model from the seed and returns layers
// [from, to) of its staged form.
func buildStaged(o phalanx.Options, seed uint64, from, to int) ([]nn.Layer, error) {
	m, err := whole(o, seed)
	if err != nil {
		return nil, err
	}
	emb, ok := m.emb.(*nn.Embedding)
	if !ok {
		return nil, fmt.Errorf("gpt: the whole model's embedding is a %T", m.emb)
	}
	ls := append([]nn.Layer{&tokens{emb: emb}}, m.layers...)
	if from < 0 || to > len(ls) || from >= to {
		return nil, fmt.Errorf("gpt: layers %d..%d of %d", from, to-1, len(ls))
	}
	return ls[from:to], nil
}

// tokens is the token embedding as a layer: its input is one token id a
// row (as a float32), its output the id's row of the table.
type tokens struct {
	emb *nn.Embedding
	ids []int32
}

func (t *tokens) Params() []*nn.Param { return t.emb.Params() }

// Forward looks the rows' ids up; an id outside the vocabulary (which
// the staged data never gives) panics, naming it.
func (t *tokens) Forward(x nn.Matrix) nn.Matrix {
	t.ids = t.ids[:0]
	for _, v := range x.Data[:x.Rows] {
		t.ids = append(t.ids, int32(v))
	}
	y, err := t.emb.Lookup(t.ids)
	if err != nil {
		panic(err)
	}
	return y
}

// Backward adds the rows' gradients into the table; the input (ids) has
// none.
func (t *tokens) Backward(dy nn.Matrix) nn.Matrix {
	t.emb.Backward(dy)
	return nn.Matrix{}
}

// stagedData is the corpus as token rows.
func stagedData(o phalanx.Options, seed uint64) (train, test phalanx.Dataset, err error) {
	_, _, tr, te, err := windows(o)
	if err != nil {
		return nil, nil, err
	}
	return &tokenRows{tr}, &tokenRows{te}, nil
}

// tokenRows are windows as rows of tokens: a window is Context rows, each
// one token id (the feature) and the next one (the label).
type tokenRows struct{ w *Windows }

func (r *tokenRows) Len() int { return r.w.Len() }

func (r *tokenRows) Fill(idx []int, b *worker.Batch) error {
	c, n := r.w.Context, r.w.Len()
	b.Reset(len(idx), c)
	if cap(b.Labels) < len(idx)*c {
		b.Labels = make([]int32, len(idx)*c)
	}
	b.Labels = b.Labels[:len(idx)*c]
	for k, i := range idx {
		if i < 0 || i >= n {
			return fmt.Errorf("gpt: window %d of %d", i, n)
		}
		text := r.w.Text[i*c : i*c+c+1]
		for j := range c {
			b.X[k*c+j], b.Labels[k*c+j] = float32(text[j]), int32(text[j+1])
		}
	}
	return nil
}
