package worker

import (
	"fmt"
	"github.com/phalanx-rt/phalanx/trace"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// computeAsync starts the next step's Compute on a goroutine; the actor
// stays free to take the step's decision.
func (a *rankActor) computeAsync(ctx actor.Context) {
	st := a.st
	t := st.cfg.Trainer
	if st.finished || st.computing {
		return
	}
	if t.State().Step >= st.cfg.Steps {
		a.done(nil)
		return
	}
	st.computing, st.computeFor = true, t.NextStep()
	st.overlapped = st.overlapNext == st.computeFor && !st.cfg.NoOverlap
	compute := t.Compute
	if st.overlapped {
		compute = t.ComputeOverlapped
	}
	sys, self, step := ctx.ActorSystem(), ctx.Self(), st.computeFor
	now := st.cfg.Now
	go func() {
		start := now()
		err := compute(st.cfg.Context)
		sys.Root.Send(self, &computeDone{step: step, took: now().Sub(start), err: err})
	}()
}

// computed: this rank's gradients are ready. If the step already closed
// without it, apply what the ring reduced (after joining the step's
// reduction, if its buckets were already on their way); else report ready.
func (a *rankActor) computed(ctx actor.Context, m *computeDone) {
	st := a.st
	t := st.cfg.Trainer
	st.computing = false
	if m.err != nil {
		st.joining = false
		a.fail(m.err)
		return
	}
	if st.joining {
		st.joining = false
		if err := t.ReduceStep(st.cfg.Context, m.step, true); err != nil {
			a.done(err)
			return
		}
		a.applyAll(ctx)
		return
	}
	if t.Pending() > 0 {
		a.applyAll(ctx)
		return
	}
	a.sendReady(ctx, m.step, m.took)
}

// goHybrid takes a step's decision: a participant reduces its gradients
// and applies; a late rank joins the reduction with zeros (even while it
// computes) and applies once its Compute has returned. A late rank of an
// overlapped step that already sent a bucket of it cannot be left out: it
// reduces as a participant once its Compute has returned, and the others'
// reductions wait for it.
func (a *rankActor) goHybrid(ctx actor.Context, m *phalanxpb.StepGo) {
	st := a.st
	t := st.cfg.Trainer
	if st.finished {
		return
	}
	if m.Generation != st.cfg.Generation {
		a.done(fmt.Errorf("worker: rank %d got a decision of generation %d in generation %d", st.cfg.Rank, m.Generation, st.cfg.Generation))
		return
	}
	if st.computing && m.Step != st.computeFor {
		// A later step closed while this one is still computed: it is
		// reduced after this one is applied, so that every rank's
		// collective operations stay in the same order.
		st.deferred = append(st.deferred, m)
		return
	}
	if m.OverlapNext {
		st.overlapNext = m.Step + 1
	}
	a.decided(trace.ThreadHybrid, "hybrid wait", m.Step)
	participate := slices.Contains(m.Participants, uint32(st.cfg.Rank))
	if !participate && st.overlapped && m.Step == st.computeFor && !t.Withdraw(m.Step) {
		st.cfg.Logger.Debug("late in an overlapped step after sending a bucket: joining it", zap.Int("rank", st.cfg.Rank), zap.Int64("step", m.Step))
		if st.computing {
			st.joining = true
			return
		}
		participate = true
	}
	if err := t.ReduceStep(st.cfg.Context, m.Step, participate); err != nil {
		a.done(err)
		return
	}
	if !st.computing {
		a.applyAll(ctx)
	}
}

// applyAll applies every reduced step, taking the deferred decisions (steps
// this rank never computed) in order once the steps before them are
// applied, then computes the next step. It runs only while no Compute does.
func (a *rankActor) applyAll(ctx actor.Context) {
	st := a.st
	t := st.cfg.Trainer
	for t.Pending() > 0 || len(st.deferred) > 0 {
		if t.Pending() == 0 {
			m := st.deferred[0]
			st.deferred = st.deferred[1:]
			if m.OverlapNext {
				st.overlapNext = m.Step + 1
			}
			if err := t.ReduceStep(st.cfg.Context, m.Step, false); err != nil {
				a.done(err)
				return
			}
		}
		stats, err := t.ApplyStep(st.cfg.Context)
		if err != nil {
			a.fail(err)
			return
		}
		if !a.afterStep(stats) {
			return
		}
	}
	ctx.Send(ctx.Self(), &computeNext{})
}
