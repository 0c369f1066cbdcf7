package worker

import (
	"context"
	"fmt"
	"math"
	"runtime/debug"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
)

// Stale says what a rank does with gradients that missed their step's
// deadline in hybrid-synchronous training.
type Stale uint8

const (
	// StaleDrop discards them (the default).
	StaleDrop Stale = iota
	// StaleDecay adds them, scaled by Config.StaleDecay, to this rank's
	// gradients of the next step it takes part in.
	StaleDecay
)

// hybridResult is a reduced step waiting to be applied.
type hybridResult struct {
	step         int64
	flat         []float32
	participated bool
}

// layout of the statistics after the gradients in a hybrid step's buffer:
// loss sum, correct, the fingerprint, the contributing samples and ranks,
// the votes.
const (
	hybridCount = statsVotes
	hybridRanks = statsVotes + 1
	hybridTail  = statsVotes + 2 + len(checkpoint.Votes{})
)

func (t *Trainer) hybridLen() int {
	n := 0
	for _, p := range t.params {
		n += len(p.Grad)
	}
	return n + hybridTail
}

// ReduceStep joins the allreduce of a hybrid-synchronous step, in the order
// the ranks' steps close. A participant (its Compute of that step has
// finished) contributes its gradients, statistics and sample count; a late
// rank contributes zeros and may call ReduceStep while its Compute still
// runs on another goroutine: nothing Compute reads or writes is touched. The
// result waits for ApplyStep. Every rank calls ReduceStep once per closed
// step, whether it took part or not.
func (t *Trainer) ReduceStep(ctx context.Context, step int64, participate bool) error {
	var flat []float32
	if n := len(t.hybridFree); n > 0 {
		flat, t.hybridFree = t.hybridFree[n-1], t.hybridFree[:n-1]
		clear(flat)
	} else {
		flat = make([]float32, t.hybridLen())
	}
	if participate {
		if t.phase != phaseComputed || t.pend.step != step {
			return fmt.Errorf("worker: rank takes part in step %d without its gradients (computed: step %d)", step, t.pend.step)
		}
		at := 0
		for i, p := range t.params {
			copy(flat[at:], p.Grad)
			if t.staleGrads != nil {
				for k, g := range t.staleGrads[i] {
					flat[at+k] += g
				}
			}
			at += len(p.Grad)
		}
		t.staleGrads = nil
		st := flat[at:]
		st[0], st[1] = float32(t.pend.sum), float32(t.pend.correct)
		for i, v := range t.pend.fp {
			st[2+i] = float32(v)
		}
		st[hybridCount], st[hybridRanks] = float32(len(t.idx)), 1
	}
	if t.voter != nil {
		v := t.voter()
		copy(flat[len(flat)-len(v):], v[:])
	}
	if err := t.g.AllReduce(ctx, collective.Float32s(flat), collective.Sum); err != nil {
		return fmt.Errorf("worker: step %d: hybrid allreduce: %w", step, err)
	}
	t.hybridQueue = append(t.hybridQueue, hybridResult{step: step, flat: flat, participated: participate})
	return nil
}

// Pending is the number of reduced steps waiting for ApplyStep.
func (t *Trainer) Pending() int { return len(t.hybridQueue) }

// ApplyStep applies the oldest reduced step: the gradients of the ranks
// that took part, averaged over the samples they contributed, go through the
// same clipping and optimizer update on every rank, so parameters stay
// bitwise identical. A rank that computed the step but was late discards its
// gradients (or keeps them for the next step, with StaleDecay); a rank that
// never computed the step only advances its sampler position. Call it after
// this rank's Compute of the step, if any, has returned.
func (t *Trainer) ApplyStep(ctx context.Context) (_ StepStats, err error) {
	if len(t.hybridQueue) == 0 {
		return StepStats{}, fmt.Errorf("worker: no reduced step to apply")
	}
	r := t.hybridQueue[0]
	t.hybridQueue = t.hybridQueue[1:]
	defer func() {
		t.hybridFree = append(t.hybridFree, r.flat)
		if v := recover(); v != nil { // Recover repairs the step (see rankActor.resume)
			err = &PanicError{Step: r.step, Value: v, Stack: debug.Stack()}
		}
	}()
	s, p := t.state, &t.pend
	if r.step != s.Step+1 {
		return StepStats{}, fmt.Errorf("worker: applying step %d at step %d", r.step, s.Step)
	}
	computed := t.phase == phaseComputed && p.step == r.step
	if !computed { // this rank never computed the step: only its position moves
		global, _ := t.globalBatch()
		_, size, next, err := t.sampler.Batch(s.Position, global, t.g.Size(), t.g.Rank(), t.idx[:0])
		if err != nil {
			return StepStats{}, err
		}
		*p = pending{step: r.step, size: size, next: next, start: time.Now()}
	} else if !r.participated && t.cfg.Stale == StaleDecay {
		if t.staleGrads == nil {
			t.staleGrads = make([][]float32, len(t.params))
			for i, q := range t.params {
				t.staleGrads[i] = make([]float32, len(q.Grad))
			}
		}
		for i, q := range t.params {
			for k, g := range q.Grad {
				t.staleGrads[i][k] = g * float32(t.cfg.StaleDecay)
			}
		}
	}
	st := r.flat[len(r.flat)-hybridTail:]
	count := st[hybridCount]
	if count <= 0 {
		return StepStats{}, fmt.Errorf("worker: step %d: no rank contributed samples", r.step)
	}
	// Each rank scaled its gradients by 1/size of the global batch; the
	// average is over the samples that contributed.
	scale := float32(p.size) / count
	at := 0
	for _, q := range t.params {
		for k := range q.Grad {
			q.Grad[k] = r.flat[at+k] * scale
		}
		at += len(q.Grad)
	}
	copy(t.stats, st[:statsVotes])
	copy(t.stats[statsVotes:], st[hybridRanks+1:])
	p.size = int(count)
	if v := float64(t.stats[0]); math.IsNaN(v) || math.IsInf(v, 0) {
		return StepStats{}, &NonFiniteError{Step: r.step}
	}
	if err := checkFinite(t.params, r.step); err != nil {
		return StepStats{}, err
	}
	p.clipped = false
	stats, err := t.update(ctx, StepStats{})
	stats.Participated, stats.Participants = r.participated, int(st[hybridRanks])
	return stats, err
}
