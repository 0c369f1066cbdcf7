package gpt

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/tp"
	"github.com/phalanx-rt/phalanx/worker"
)

// Config is the model's shape.
type Config struct {
	Width   int // features of every token (d)
	Depth   int // transformer blocks
	Heads   int // attention heads; they divide Width
	Context int // tokens a window holds, and the positions learned
	// SequenceParallel splits the rows (tokens) of the regions tensor
	// parallelism does not (LayerNorms, the residual stream) across the
	// tensor-parallel ranks, as Megatron-LM's sequence parallelism.
	SequenceParallel bool
}

// Check is an error naming what does not fit, for a model split across
// tp tensor-parallel ranks (1: not split).
func (c Config) Check(tp int) error {
	switch {
	case c.Width < 1 || c.Depth < 1 || c.Heads < 1 || c.Context < 1:
		return fmt.Errorf("gpt: width %d, depth %d, heads %d, context %d: each must be at least 1", c.Width, c.Depth, c.Heads, c.Context)
	case c.Width%c.Heads != 0:
		return fmt.Errorf("gpt: %d heads do not divide the width %d", c.Heads, c.Width)
	case tp < 1:
		return fmt.Errorf("gpt: %d tensor-parallel ranks", tp)
	case c.Heads%tp != 0:
		return fmt.Errorf("gpt: %d tensor-parallel ranks do not divide the %d heads", tp, c.Heads)
	case c.Width%tp != 0:
		return fmt.Errorf("gpt: %d tensor-parallel ranks do not divide the width %d", tp, c.Width)
	case Vocab%tp != 0:
		return fmt.Errorf("gpt: %d tensor-parallel ranks do not divide the vocabulary of %d", tp, Vocab)
	}
	return nil
}

// Params is the number of parameters of the whole model.
func (c Config) Params() int64 {
	d := int64(c.Width)
	block := 2*2*d + (3*d*d + 3*d) + (d*d + d) + (4*d*d + 4*d) + (4*d*d + d)
	return Vocab*d + int64(c.Context)*d + int64(c.Depth)*block + 2*d + d*Vocab + Vocab
}

type embedder interface {
	Lookup(ids []int32) (nn.Matrix, error)
	Backward(dy nn.Matrix)
	Params() []*nn.Param
}

type lossFunc interface {
	Loss(logits nn.Matrix, labels []int32, scale float32) (sum float64, correct int, grad nn.Matrix, err error)
}

// Model is the GPT; it implements worker.Model and worker.Evaluator. Its
// Params are the body's (positions, blocks, final LayerNorm, head) and
// then the token embedding's.
type Model struct {
	Config
	emb    embedder
	body   *nn.Sequential
	layers []nn.Layer // the body's, for Slices
	loss   lossFunc
	comm   *tp.Comm
	sync   []*nn.Param // sequence parallel: the gradients summed across the group after the backward
	params []*nn.Param
	ids    []int32
	labels []int32
}

// New builds the model with weights drawn from seed: GPT-2's
// initialisation (nn.NewBlock), the embedding N(0, 1/Width), the head
// N(0, 0.02²). With comm, every rank draws the same whole model and keeps
// its tensor-parallel part (tp.CutBlock, a vocabulary-parallel embedding,
// head and loss).
func New(cfg Config, seed uint64, comm *tp.Comm) (*Model, error) {
	T := 1
	if comm != nil {
		T = comm.Size()
	}
	if err := cfg.Check(T); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x677074))
	emb := nn.NewEmbedding("tok", Vocab, cfg.Width, rng)
	layers := []nn.Layer{nn.NewPositions("pos", cfg.Context, cfg.Width, rng)}
	blocks := make([]*nn.Block, cfg.Depth)
	for i := range blocks {
		b, err := nn.NewBlock(fmt.Sprintf("h%d", i), cfg.Heads, cfg.Width, cfg.Context, cfg.Depth, rng)
		if err != nil {
			return nil, err
		}
		blocks[i] = b
	}
	final := nn.NewLayerNorm("lnf", cfg.Width)
	head := nn.NewDenseNormal("head", cfg.Width, Vocab, 0.02, rng)
	m := &Model{Config: cfg, comm: comm}
	if comm == nil {
		for _, b := range blocks {
			layers = append(layers, b.Layers()...)
		}
		layers = append(layers, final, head)
		m.emb, m.loss = emb, &nn.SoftmaxCrossEntropy{}
	} else {
		if cfg.SequenceParallel {
			layers = append(layers, tp.NewSeqSplit(comm))
		}
		for _, b := range blocks {
			var cut []nn.Layer
			var err error
			if cfg.SequenceParallel {
				var sync []*nn.Param
				cut, sync, err = tp.CutBlockSequenceParallel(comm, b)
				m.sync = append(m.sync, sync...)
			} else {
				cut, err = tp.CutBlock(comm, b)
			}
			if err != nil {
				return nil, err
			}
			layers = append(layers, cut...)
		}
		h := tp.NewColumnParallel(comm, head, false)
		h.Local.SkipInputGrad = false
		layers = append(layers, final)
		if cfg.SequenceParallel {
			h.SeqParallel = true
			layers = append(layers, tp.NewSeqGather(comm))
			m.sync = append(m.sync, final.Gain, final.Bias)
		}
		layers = append(layers, h)
		m.emb, m.loss = tp.NewVocabParallelEmbedding(comm, emb), tp.NewVocabParallelLoss(comm, Vocab)
	}
	m.layers = layers
	m.body = nn.NewSequential(layers...)
	m.params = append(append([]*nn.Param(nil), m.body.Params()...), m.emb.Params()...)
	return m, nil
}

// Params lists the parameters (this rank's parts of them, when split).
func (m *Model) Params() []*nn.Param { return m.params }

// Slices says where each of Params lies in its logical tensor, in the
// same order.
func (m *Model) Slices() []tp.Slice {
	out := tp.SlicesOf(m.layers...)
	if s, ok := m.emb.(tp.Sliced); ok {
		return append(out, s.Slices()...)
	}
	return append(out, tp.Whole(m.emb.Params()[0]))
}

// split makes the inputs and labels of a batch of windows.
func (m *Model) split(b *worker.Batch) (ids, labels []int32, err error) {
	c := m.Context
	if len(b.IDs) != b.N*(c+1) {
		return nil, nil, fmt.Errorf("gpt: a batch of %d windows with %d ids; the model reads windows of %d", b.N, len(b.IDs), c+1)
	}
	m.ids, m.labels = m.ids[:0], m.labels[:0]
	for i := range b.N {
		w := b.IDs[i*(c+1) : (i+1)*(c+1)]
		m.ids = append(m.ids, w[:c]...)
		m.labels = append(m.labels, w[1:]...)
	}
	return m.ids, m.labels, nil
}

// forward is the loss of a batch, and its gradient scaled by scale.
func (m *Model) forward(b *worker.Batch, scale float32) (worker.Result, nn.Matrix, error) {
	ids, labels, err := m.split(b)
	if err != nil {
		return worker.Result{}, nn.Matrix{}, err
	}
	x, err := m.emb.Lookup(ids)
	if err != nil {
		return worker.Result{}, nn.Matrix{}, err
	}
	c := float64(m.Context)
	sum, correct, grad, err := m.loss.Loss(m.body.Forward(x), labels, scale/float32(c))
	if err != nil {
		return worker.Result{}, nn.Matrix{}, err
	}
	if err := m.commErr(); err != nil {
		return worker.Result{}, nn.Matrix{}, err
	}
	// A sample's loss is its tokens' mean; a sample is right by the share
	// of its tokens predicted right (rounded over the batch).
	return worker.Result{LossSum: sum / c, Correct: int(math.Round(float64(correct) / c))}, grad, nil
}

func (m *Model) commErr() error {
	if m.comm == nil {
		return nil
	}
	return m.comm.Err()
}

// Step is forward, loss and backward; gradients are announced layer by
// layer, the token embedding's last. A sample's loss is the mean over its
// tokens, in nats.
func (m *Model) Step(b *worker.Batch, scale float32, ready func(int)) (worker.Result, error) {
	res, grad, err := m.forward(b, scale)
	if err != nil {
		return res, err
	}
	if m.sync == nil {
		m.emb.Backward(m.body.Backward(grad, ready))
		if ready != nil {
			for i := len(m.body.Params()); i < len(m.params); i++ {
				ready(i)
			}
		}
		return res, m.commErr()
	}
	// Sequence parallel: some gradients are complete only once summed
	// across the group, so every one is announced after that.
	m.emb.Backward(m.body.Backward(grad, nil))
	m.comm.SyncGrads(m.sync)
	if ready != nil {
		for i := len(m.params) - 1; i >= 0; i-- {
			ready(i)
		}
	}
	return res, m.commErr()
}

// Evaluate scores a batch.
func (m *Model) Evaluate(b *worker.Batch) (worker.Result, error) {
	res, _, err := m.forward(b, 0)
	return res, err
}

// Unigram is the cross-entropy, in nats per character, of the characters
// test's windows predict under the byte frequencies of train (add-one
// smoothed): what a model that ignores context reaches, the baseline of
// the held-out loss.
func Unigram(train []byte, test *Windows) float64 {
	var counts [Vocab]float64
	for _, c := range train {
		counts[c]++
	}
	total := float64(len(train) + Vocab)
	var h float64
	n := 0
	for i := range test.Len() {
		for _, c := range test.Text[i*test.Context+1 : i*test.Context+test.Context+1] {
			h -= math.Log((counts[c] + 1) / total)
			n++
		}
	}
	return h / float64(max(n, 1))
}

// Measures are the held-out measures of a language model: the loss in
// nats per character, bits per character, and the perplexity.
func Measures(loss, _ float64) map[string]float64 {
	return map[string]float64{"nats_per_char": loss, "bits_per_char": loss / math.Ln2, "perplexity": math.Exp(loss)}
}
