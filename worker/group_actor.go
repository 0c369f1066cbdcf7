package worker

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// GroupConfig configures the group actor: the control plane's step leader.
// World and Generation are the round it leads first (World 0: none yet);
// a GroupRound message moves it to another.
type GroupConfig struct {
	World      int
	Generation uint64
	Logger     *zap.Logger
	// Hybrid, when set, makes the group actor close each step when every
	// rank is ready or at the deadline with a quorum (see package hybrid);
	// nil is bulk-synchronous (every step waits for every rank).
	Hybrid *hybrid.Policy
	// OnExclude is told of the stragglers the policy excludes; the caller
	// asks the coordinator.
	OnExclude func(Exclusion)
	// OnPace, when set, is told after every closed hybrid step of the next
	// step's deadline and of the ring's typical overhead (see Exclusion).
	OnPace func(deadline, overhead time.Duration)
	// OnFallback, when set, is told of every overlapped hybrid step in which
	// a rank missed the deadline (see hybrid.Overlap).
	OnFallback func(Fallback)
	// Now is the clock of the deadlines (default time.Now).
	Now func() time.Time
}

// Exclusion is a straggler the hybrid policy excludes: a ring member, by id,
// late in LateIn of its last Window steps.
type Exclusion struct {
	ID             string
	LateIn, Window int
	Step           int64 // the step whose close decided it
	// Deadline is the step deadline it missed; Overhead the ring's typical
	// time from a step's opening to a rank's readiness beyond the rank's
	// own compute. Its probation steps are judged by both.
	Deadline, Overhead time.Duration
}

// Fallback is an overlapped hybrid step in which ranks missed the deadline:
// those that had sent a bucket were waited for, and the steps after it close
// at the deadline until the ring is on time again.
type Fallback struct {
	Step     int64
	Late     []uint32 // ranks not ready by the deadline
	Deadline time.Duration
}

// groupState outlives the actor instance, so a restarted group actor knows
// which ranks are already ready.
type groupState struct {
	cfg   GroupConfig
	early []*phalanxpb.StepReady // of a newer generation than cfg's, replayed when it begins
	h     hybridLeader
}

// GroupRound moves a group actor to another generation (an elastic ring
// change): World ranks, or 0 when this process does not lead that round.
// Readiness of older generations is dropped; readiness that arrived early for
// this one is taken.
type GroupRound struct {
	Generation uint64
	World      int
	Members    []string // member ids by rank (hybrid: for straggler exclusion)
}

// NewGroupProps returns the props of a group actor: the control plane's
// leader of a ring's steps. With a hybrid policy it decides every step: it
// collects StepReady from the ranks and closes the step when all are in or
// at the deadline with a quorum, sending each rank StepGo with the step's
// participants. A bulk-synchronous ring has no step to decide (its ranks
// send no StepReady: the allreduce waits for every rank of the generation
// itself), and its group actor only logs the ranks' restarts (each rank
// reports its own, RankConfig.OnRestart). It holds no
// tensors; the ranks reduce through the collective group.
func NewGroupProps(cfg GroupConfig) *actor.Props {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	st := &groupState{cfg: cfg}
	st.h.begin(nil)
	if cfg.Hybrid != nil {
		st.h.hist = hybrid.NewHistory()
	}
	return actor.PropsFromProducer(func() actor.Actor { return &groupActor{st: st} })
}

type groupActor struct{ st *groupState }

func (a *groupActor) Receive(ctx actor.Context) {
	st := a.st
	switch m := ctx.Message().(type) {
	case *GroupRound:
		st.cfg.Generation, st.cfg.World = m.Generation, m.World
		st.h.begin(m.Members)
		early := st.early
		st.early = nil
		for _, e := range early {
			if e.Generation >= m.Generation {
				a.ready(ctx, e)
			}
		}
	case *phalanxpb.StepReady:
		a.ready(ctx, m)
	case *deadlineTick:
		if m.generation == st.cfg.Generation && m.step == st.h.open {
			a.tryClose(ctx)
		}
	case *phalanxpb.RankRestarted:
		st.cfg.Logger.Warn("rank restarted", zap.Uint32("rank", m.Rank), zap.Int64("committed_step", m.CommittedStep),
			zap.String("reason", m.Reason), zap.Uint32("restarts", m.Restarts))
	}
}

// maxEarly bounds the readiness kept for a generation not begun yet.
const maxEarly = 1 << 12

func (a *groupActor) ready(ctx actor.Context, m *phalanxpb.StepReady) {
	st := a.st
	if m.Generation > st.cfg.Generation && m.From != nil && len(st.early) < maxEarly {
		st.early = append(st.early, m)
		return
	}
	if m.Generation != st.cfg.Generation || int(m.Rank) >= st.cfg.World || m.From == nil {
		st.cfg.Logger.Warn("refusing a step-ready message", zap.Uint32("rank", m.Rank), zap.Int64("step", m.Step),
			zap.Uint64("generation", m.Generation), zap.Uint64("ours", st.cfg.Generation))
		return
	}
	if st.cfg.Hybrid == nil {
		st.cfg.Logger.Warn("refusing a step-ready message: a bulk-synchronous group decides no steps", zap.Uint32("rank", m.Rank), zap.Int64("step", m.Step))
		return
	}
	a.readyHybrid(ctx, m)
}
