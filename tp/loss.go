package tp

import (
	"fmt"
	"math"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// VocabParallelLoss is softmax cross-entropy over logits split by
// vocabulary (each rank holds the columns collective.ShardRange gives it
// of vocab), computed without gathering them, as Megatron-LM does: the
// rows' maxima, then their sums of exponentials and the labels' logits,
// are reduced across the group, three small all-reduces of one value a
// row. It gives what nn.SoftmaxCrossEntropy gives on the whole logits:
// the summed loss, the rows whose first largest logit is the label, and
// this rank's columns of scale × the loss's gradient.
type VocabParallelLoss struct {
	comm          *Comm
	vocab, lo, hi int
	max, sums     []float64
	first         []float64
	grad          []float32
}

// NewVocabParallelLoss is the loss over a vocabulary of vocab split on
// comm's group.
func NewVocabParallelLoss(comm *Comm, vocab int) *VocabParallelLoss {
	lo, hi := collective.ShardRange(vocab, comm.Size(), comm.Rank())
	return &VocabParallelLoss{comm: comm, vocab: vocab, lo: lo, hi: hi}
}

// Range is the vocabulary columns this rank holds.
func (l *VocabParallelLoss) Range() (lo, hi int) { return l.lo, l.hi }

// Loss takes this rank's columns of the logits and every row's label
// (the same on every rank).
func (l *VocabParallelLoss) Loss(logits nn.Matrix, labels []int32, scale float32) (sum float64, correct int, grad nn.Matrix, err error) {
	rows, w := logits.Rows, l.hi-l.lo
	switch {
	case logits.Cols != w:
		return 0, 0, nn.Matrix{}, fmt.Errorf("tp: %d logit columns on a rank holding %d of a vocabulary of %d", logits.Cols, w, l.vocab)
	case len(labels) != rows:
		return 0, 0, nn.Matrix{}, fmt.Errorf("tp: %d labels for %d rows", len(labels), rows)
	}
	for i, label := range labels {
		if label < 0 || int(label) >= l.vocab {
			return 0, 0, nn.Matrix{}, fmt.Errorf("tp: label %d of row %d outside a vocabulary of %d", label, i, l.vocab)
		}
	}
	reduce := func(b []float64, op collective.ReduceOp) error {
		if l.comm.alone() {
			return nil
		}
		t0 := l.comm.now()
		err := l.comm.G.AllReduce(l.comm.ctx, collective.Float64s(b), op)
		l.comm.spent += l.comm.now().Sub(t0)
		return err
	}
	mx := growF64(&l.max, rows)
	for i := range rows {
		m := math.Inf(-1)
		for _, v := range logits.Data[i*w : (i+1)*w] {
			m = max(m, float64(v))
		}
		mx[i] = m
	}
	if err := reduce(mx, collective.Max); err != nil {
		return 0, 0, nn.Matrix{}, fmt.Errorf("tp: the logits' maxima: %w", err)
	}
	// Per row: the sum of exponentials, the label's logit (from the rank
	// holding it), and the first column attaining the maximum.
	sums := growF64(&l.sums, 2*rows)
	first := growF64(&l.first, rows)
	grad = nn.Matrix{Rows: rows, Cols: w, Data: growF32(&l.grad, rows*w)}
	for i, label := range labels {
		z, gr := logits.Data[i*w:(i+1)*w], grad.Data[i*w:(i+1)*w]
		var total float64
		first[i] = float64(l.vocab)
		for j, v := range z {
			e := nn.Exp32(v - float32(mx[i])) // mx[i] is one of the logits
			gr[j] = e
			total += float64(e)
			if float64(v) == mx[i] && first[i] == float64(l.vocab) {
				first[i] = float64(l.lo + j)
			}
		}
		sums[i], sums[rows+i] = total, 0
		if int(label) >= l.lo && int(label) < l.hi {
			sums[rows+i] = float64(z[int(label)-l.lo])
		}
	}
	if err := reduce(sums, collective.Sum); err != nil {
		return 0, 0, nn.Matrix{}, fmt.Errorf("tp: the softmax sums: %w", err)
	}
	if err := reduce(first, collective.Min); err != nil {
		return 0, 0, nn.Matrix{}, fmt.Errorf("tp: the logits' first maxima: %w", err)
	}
	for i, label := range labels {
		total := sums[i]
		sum += math.Log(total) + mx[i] - sums[rows+i]
		if int(first[i]) == int(label) {
			correct++
		}
		gr := grad.Data[i*w : (i+1)*w]
		for j := range gr {
			gr[j] = float32(float64(gr[j])/total) * scale
		}
		if int(label) >= l.lo && int(label) < l.hi {
			gr[int(label)-l.lo] -= scale
		}
	}
	return sum, correct, grad, nil
}

func growF64(b *[]float64, n int) []float64 {
	if cap(*b) < n {
		*b = make([]float64, n)
	}
	*b = (*b)[:n]
	return *b
}

func growF32(b *[]float32, n int) []float32 { return grow(b, n) }
