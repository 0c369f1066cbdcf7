package worker

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

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

// hybridResult is a reduced step waiting to be applied: in the trainer's
// gradient arena (a participant's, reduced in place) or in a spare arena (a
// late rank's).
type hybridResult struct {
	step         int64
	spare        *spareArena // nil: the trainer's arena
	participated bool
	overlapped   bool // this rank's buckets were sent during its backward pass
}

// ReduceStep joins the allreduce of a hybrid-synchronous step, in the order
// the ranks' steps close. A participant (its Compute of that step has
// finished) reduces its gradients, statistics and sample count in place, in
// the same buckets as a synchronous step; a late rank contributes zeros from
// a spare buffer and may call ReduceStep while its Compute still runs on
// another goroutine: nothing Compute reads or writes is touched. The result
// waits for ApplyStep. Every rank calls ReduceStep once per closed step,
// whether it took part or not. A participant whose step was computed by
// ComputeOverlapped has sent its buckets already and only waits for them.
func (t *Trainer) ReduceStep(ctx context.Context, step int64, participate bool) error {
	if !participate {
		s, err := t.spare()
		if err != nil {
			return err
		}
		t.writeVotes(s.buf[len(s.buf)-statsLen:])
		if err := reduceAll(ctx, s.fuser); err != nil {
			t.hybridFree = append(t.hybridFree, s)
			return fmt.Errorf("worker: step %d: hybrid allreduce: %w", step, err)
		}
		t.hybridQueue = append(t.hybridQueue, hybridResult{step: step, spare: s})
		return nil
	}
	if t.phase != phaseComputed || t.pend.step != step || t.pend.withdrawn {
		return fmt.Errorf("worker: rank takes part in step %d without its gradients (computed: step %d)", step, t.pend.step)
	}
	if len(t.hybridQueue) > 0 {
		return fmt.Errorf("worker: rank takes part in step %d with %d reduced steps not applied", step, len(t.hybridQueue))
	}
	overlapped := t.pend.sealed
	if !overlapped {
		if t.staleGrads != nil {
			for k, g := range t.staleGrads {
				t.grads.buf[k] += g
			}
			t.staleGrads = nil
		}
		t.pend.sealed = true
		t.writeStats()
		for k := range t.marked {
			if err := t.mark(k); err != nil {
				return err
			}
		}
	}
	t.flushUnlessFused() // the last commit's copy, while the buckets are reduced
	if err := t.fuser.Wait(ctx); err != nil {
		return fmt.Errorf("worker: step %d: hybrid allreduce: %w", step, err)
	}
	t.hybridQueue = append(t.hybridQueue, hybridResult{step: step, participated: true, overlapped: overlapped})
	return nil
}

// reduceAll reduces every chunk of a Fuser's round.
func reduceAll(ctx context.Context, f *collective.Fuser[float32]) error {
	f.Reset()
	for k := range f.Buckets() {
		if err := f.MarkReady(k); err != nil {
			return err
		}
	}
	return f.Wait(ctx)
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
	t.hybridQueue = t.hybridQueue[:copy(t.hybridQueue, t.hybridQueue[1:])]
	defer func() {
		if r.spare != nil {
			t.hybridFree = append(t.hybridFree, r.spare)
		}
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
		own := t.grads.grads()
		if t.staleGrads == nil {
			t.staleGrads = make([]float32, len(own))
		}
		for k, g := range own {
			t.staleGrads[k] = g * float32(t.cfg.StaleDecay)
		}
	}
	flat := t.grads.buf
	if r.spare != nil {
		flat = r.spare.buf
	}
	st := flat[len(flat)-statsLen:]
	count := st[statsCount]
	if count <= 0 {
		return StepStats{}, fmt.Errorf("worker: step %d: no rank contributed samples", r.step)
	}
	// Each rank scaled its gradients by 1/size of the global batch; the
	// average is over the samples that contributed.
	scale := float32(p.size) / count
	own := t.grads.grads()
	for k, g := range flat[:len(own)] {
		own[k] = g * scale
	}
	copy(t.stats, st)
	p.size = int(count)
	if err := t.checkReduced(ctx, r.step); err != nil {
		return StepStats{}, err
	}
	p.clipped = false
	// update commits what it is given with the step's figures: a step
	// reported again after a ring change (Resync) says who took part.
	return t.update(ctx, StepStats{Participated: r.participated, Participants: int(st[statsRanks]), Overlapped: r.overlapped})
}
