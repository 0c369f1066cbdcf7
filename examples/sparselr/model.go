package sparselr

import (
	"context"
	"fmt"
	"math"

	"github.com/phalanx-rt/phalanx/ps"
)

// Params is where the model's weights live: a parameter-server client (or
// anything that pulls and pushes rows the same way).
type Params interface {
	Pull(ctx context.Context, table uint32, keys []uint64, out []float32) error
	Push(ctx context.Context, table uint32, keys []uint64, grads []float32) (stale int, err error)
}

// Table is the id of the weights' table.
const Table uint32 = 1

// Spec is the weights' table for ids feature ids: one float per id, and a
// bias row at key ids; zeros to start, trained by opt at rate lr.
func Spec(ids int, opt ps.OptimizerKind, lr float32) ps.TableSpec {
	return ps.TableSpec{ID: Table, Name: "sparse-lr", Dim: 1, KeySpace: uint64(ids) + 1, Init: ps.InitZeros, Optimizer: opt, LR: lr}
}

// Model is logistic regression over a click log's ids, its weights in
// Params. It is not safe for concurrent use.
type Model struct {
	p    Params
	bias uint64
	// scratch, reused across steps
	slot  map[uint64]int32
	keys  []uint64
	w     []float32
	grads []float32
}

// NewModel trains weights in p for ids feature ids.
func NewModel(p Params, ids int) *Model {
	return &Model{p: p, bias: uint64(ids), slot: map[uint64]int32{}}
}

// gather collects the distinct ids of examples idx (and the bias) into
// m.keys and pulls their weights.
func (m *Model) gather(ctx context.Context, l *Log, idx []int) error {
	clear(m.slot)
	m.keys = append(m.keys[:0], m.bias)
	m.slot[m.bias] = 0
	for _, i := range idx {
		if i < 0 || i >= l.Len() {
			return fmt.Errorf("sparselr: example %d outside a log of %d", i, l.Len())
		}
		for _, id := range l.Example(i) {
			if _, ok := m.slot[id]; !ok {
				m.slot[id] = int32(len(m.keys))
				m.keys = append(m.keys, id)
			}
		}
	}
	if cap(m.w) < len(m.keys) {
		m.w = make([]float32, len(m.keys), 2*len(m.keys))
		m.grads = make([]float32, len(m.keys), 2*len(m.keys))
	}
	m.w, m.grads = m.w[:len(m.keys)], m.grads[:len(m.keys)]
	return m.p.Pull(ctx, Table, m.keys, m.w)
}

func (m *Model) prob(l *Log, i int) float64 {
	z := float64(m.w[0])
	for _, id := range l.Example(i) {
		z += float64(m.w[m.slot[id]])
	}
	return 1 / (1 + math.Exp(-z))
}

// Step trains on examples idx: it pulls the weights they touch, pushes the
// gradient of their mean log-loss, and returns that loss (before the
// update) and how many shards took the push as stale.
func (m *Model) Step(ctx context.Context, l *Log, idx []int) (loss float64, stale int, err error) {
	if len(idx) == 0 {
		return 0, 0, fmt.Errorf("sparselr: an empty batch")
	}
	if err := m.gather(ctx, l, idx); err != nil {
		return 0, 0, err
	}
	clear(m.grads)
	inv := 1 / float64(len(idx))
	for _, i := range idx {
		p := m.prob(l, i)
		y := 0.0
		if l.Clicked[i] {
			y = 1
		}
		q := math.Min(math.Max(p, 1e-7), 1-1e-7)
		loss -= y*math.Log(q) + (1-y)*math.Log(1-q)
		g := float32((p - y) * inv)
		m.grads[0] += g
		for _, id := range l.Example(i) {
			m.grads[m.slot[id]] += g
		}
	}
	stale, err = m.p.Push(ctx, Table, m.keys, m.grads)
	return loss * inv, stale, err
}

// Predict scores examples lo..hi-1 of l into out (click probabilities),
// pulling weights in chunks.
func (m *Model) Predict(ctx context.Context, l *Log, lo, hi int, out []float32) error {
	if lo < 0 || hi > l.Len() || lo > hi || len(out) != hi-lo {
		return fmt.Errorf("sparselr: predicting %d..%d of %d into %d", lo, hi, l.Len(), len(out))
	}
	idx := make([]int, 0, 4096)
	for a := lo; a < hi; a += cap(idx) {
		idx = idx[:0]
		for i := a; i < min(a+cap(idx), hi); i++ {
			idx = append(idx, i)
		}
		if err := m.gather(ctx, l, idx); err != nil {
			return err
		}
		for _, i := range idx {
			out[i-lo] = float32(m.prob(l, i))
		}
	}
	return nil
}

// Local is Params over rows held in this process (tests and single-process
// runs): pushes apply at once.
type Local struct{ rows *ps.Rows }

// NewLocal holds the rows of spec.
func NewLocal(spec ps.TableSpec) (*Local, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	return &Local{rows: ps.NewRows(spec)}, nil
}

// Pull implements Params.
func (l *Local) Pull(_ context.Context, _ uint32, keys []uint64, out []float32) error {
	l.rows.Pull(keys, out)
	return nil
}

// Push implements Params.
func (l *Local) Push(_ context.Context, _ uint32, keys []uint64, grads []float32) (int, error) {
	l.rows.Apply(keys, grads, 1)
	return 0, nil
}
