package worker

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// hybridLeader is the group actor's state for hybrid-synchronous steps: the
// open step, who reported ready and when, and the straggler history.
type hybridLeader struct {
	members  []string
	pids     map[uint32]*actor.PID // every rank's actor, learnt from its readiness
	open     int64                 // the step open now (0: none yet this generation)
	openedAt time.Time
	readyAt  map[uint32]time.Duration
	compute  map[uint32]time.Duration // each ready rank's own compute time
	deadline time.Duration
	recent   []time.Duration // hybrid.StepTime of the last closed steps
	overhead []time.Duration // hybrid.Overhead of the last closed steps
	// first: the open step is a generation's first, opened by the first
	// readiness rather than by the previous step's close; its times are
	// only the spread of the ranks' readiness, not a step's.
	first bool
	hist  *hybrid.History
	timer *time.Timer
	// overlapped: the open step was announced overlapped; ov decides the
	// next step's mode.
	overlapped bool
	ov         hybrid.Overlap
}

// deadlineTick is the group actor's reminder that a step's deadline passed.
type deadlineTick struct {
	generation uint64
	step       int64
}

func (h *hybridLeader) begin(members []string) {
	h.members, h.pids, h.open = members, map[uint32]*actor.PID{}, 0
	h.readyAt, h.compute = map[uint32]time.Duration{}, map[uint32]time.Duration{}
	h.overlapped, h.ov = false, hybrid.Overlap{} // new rank actors: not overlapped until told
	if h.hist != nil {
		h.hist.Rejoined(members)
	}
	if h.timer != nil {
		h.timer.Stop()
	}
}

// readyHybrid takes a rank's readiness. The first step of a generation
// waits for every rank (the leader learns every rank's actor from it); each
// later step opens when the previous closes.
func (a *groupActor) readyHybrid(ctx actor.Context, m *phalanxpb.StepReady) {
	st, h := a.st, &a.st.h
	h.pids[m.Rank] = actor.NewPID(m.From.Address, m.From.Id)
	now := st.cfg.Now()
	if h.open == 0 {
		h.open, h.openedAt, h.first = m.Step, now, true
		h.deadline = st.cfg.Hybrid.NextDeadline(h.recent)
	}
	switch {
	case m.Step < h.open:
		return // a late rank's readiness for a step closed without it
	case m.Step > h.open:
		st.cfg.Logger.Warn("readiness for a step not open", zap.Int64("step", m.Step), zap.Int64("open", h.open))
		return
	}
	h.readyAt[m.Rank] = now.Sub(h.openedAt)
	h.compute[m.Rank] = time.Duration(m.ComputeNanos)
	if len(h.readyAt) == 1 && len(h.pids) == st.cfg.World && h.timer == nil {
		a.arm(ctx)
	}
	a.tryClose(ctx)
}

// arm schedules the open step's deadline.
func (a *groupActor) arm(ctx actor.Context) {
	st, h := a.st, &a.st.h
	sys, self := ctx.ActorSystem(), ctx.Self()
	tick := &deadlineTick{generation: st.cfg.Generation, step: h.open}
	h.timer = time.AfterFunc(h.deadline-st.cfg.Now().Sub(h.openedAt), func() { sys.Root.Send(self, tick) })
}

// tryClose closes the open step if the policy says so: StepGo, with the
// participants and whether the next step is overlapped, to every rank, and
// the next step opens. An overlapped step closes like any other; a rank late
// in it that had already sent a bucket is waited for by the others'
// reductions, so such a step is a fallback: the next ones are not
// overlapped.
func (a *groupActor) tryClose(ctx actor.Context) {
	st, h := a.st, &a.st.h
	world := st.cfg.World
	if len(h.pids) < world { // the first step waits for everyone
		return
	}
	ready, compute := make([]time.Duration, world), make([]time.Duration, world)
	for r := range ready {
		ready[r], compute[r] = hybrid.NotReady, h.compute[uint32(r)]
		if t, ok := h.readyAt[uint32(r)]; ok {
			ready[r] = t
		}
	}
	elapsed := st.cfg.Now().Sub(h.openedAt)
	closed, parts := st.cfg.Hybrid.Close(ready, elapsed, h.deadline)
	if !closed {
		return
	}
	if h.timer != nil {
		h.timer.Stop()
		h.timer = nil
	}
	var ids []uint32
	for r, p := range parts {
		if p {
			ids = append(ids, uint32(r))
		}
	}
	step := h.open
	next, fallback := st.cfg.Hybrid.Closed(&h.ov, h.overlapped, ready, h.deadline, elapsed, h.first)
	if fallback {
		var late []uint32
		for r, t := range ready {
			if t == hybrid.NotReady || t > h.deadline {
				late = append(late, uint32(r))
			}
		}
		st.cfg.Logger.Info("an overlapped step missed its deadline: the next steps close at the deadline", zap.Int64("step", step),
			zap.Uint32s("late", late), zap.Duration("deadline", h.deadline), zap.Int("overlap_after", h.ov.Need()))
		if st.cfg.OnFallback != nil {
			st.cfg.OnFallback(Fallback{Step: step, Late: late, Deadline: h.deadline})
		}
	}
	h.overlapped = next
	for _, pid := range h.pids {
		ctx.Send(pid, &phalanxpb.StepGo{Step: step, Generation: st.cfg.Generation, Participants: ids, OverlapNext: next})
	}
	if !h.first {
		h.recent = keepLast(append(h.recent, hybrid.StepTime(ready, elapsed)), 64)
		if o, ok := hybrid.Overhead(ready, compute, elapsed); ok {
			h.overhead = keepLast(append(h.overhead, o), 64)
		}
	}
	overhead := hybrid.Median(h.overhead[max(0, len(h.overhead)-st.cfg.Hybrid.AutoWindow):])
	if len(h.members) == world && st.cfg.OnExclude != nil {
		for _, s := range st.cfg.Hybrid.Record(h.hist, h.members, parts) {
			st.cfg.OnExclude(Exclusion{ID: s.ID, LateIn: s.LateIn, Window: st.cfg.Hybrid.Window, Step: step, Deadline: h.deadline, Overhead: overhead})
		}
	}
	h.open, h.openedAt, h.first = step+1, st.cfg.Now(), false
	h.readyAt, h.compute = map[uint32]time.Duration{}, map[uint32]time.Duration{}
	h.deadline = st.cfg.Hybrid.NextDeadline(h.recent)
	if st.cfg.OnPace != nil {
		st.cfg.OnPace(h.deadline, overhead)
	}
	a.arm(ctx)
}

// keepLast is d without all but its last n elements.
func keepLast(d []time.Duration, n int) []time.Duration {
	if len(d) > n {
		return d[len(d)-n:]
	}
	return d
}
