package worker

import (
	"context"
	"errors"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/trace"
)

// RankConfig configures a rank actor. The Trainer (model, optimizer, state,
// group) belongs to the process and outlives the actor: a restarted rank actor
// resumes it from its last commit.
type RankConfig struct {
	Trainer    *Trainer
	Rank       int
	Generation uint64
	Steps      int64      // the job's total; the actor stops there
	Group      *actor.PID // the group actor
	// OnStep is told of every finished step; OnDone once, when the rank has
	// done Steps steps or failed beyond what a restart can repair.
	OnStep func(StepStats)
	// OnRestart is told of this rank actor's every restart by its
	// supervisor, before it carries on (for the job's event log: a
	// bulk-synchronous step waits for no control message that would
	// order the group actor's copy before the job's end).
	OnRestart func(*phalanxpb.RankRestarted)
	// AfterStep, when set, runs at every step boundary after OnStep (where
	// a checkpoint is taken); stop ends the rank with ErrStopped, an error
	// with that error.
	AfterStep func(StepStats) (stop bool, err error)
	OnDone    func(error)
	// Hybrid: steps close at a deadline without late ranks (the group
	// actor's policy). The rank computes on a goroutine of its own, so that
	// it can join a step's allreduce while still computing it. The group
	// announces which steps are overlapped (StepGo.OverlapNext).
	Hybrid bool
	// NoOverlap makes a rank reduce its gradients only once its backward
	// pass has ended (a hybrid rank: once the step's decision came;
	// Trainer.Compute, then Finish) rather than while it runs
	// (Trainer.ComputeOverlapped). A model failure then never involves the
	// other ranks, at the price of communication the backward pass no
	// longer hides: measured on two cores, 0.85–0.9× the samples per second
	// at two ranks, so no job kind sets it.
	NoOverlap bool
	// Context bounds the collective operations.
	Context context.Context
	Logger  *zap.Logger
	// Now is the clock that times the rank's compute (default time.Now).
	Now func() time.Time
	// Trace records the wait for each step's decision (nil: none).
	Trace *trace.Recorder
}

// ErrStopped ends a rank whose AfterStep asked to stop (a graceful
// preemption at a step boundary).
var ErrStopped = errors.New("worker: stopped at a step boundary on request")

type rankState struct {
	readyAt  time.Time // this rank said it was ready (for the trace)
	cfg      RankConfig
	starts   int
	lastFail string
	finished bool
	// hybrid
	computing  bool
	computeFor int64
	deferred   []*phalanxpb.StepGo // decisions of later steps, taken after the current one is applied
	// overlapNext is the step the group announced as overlapped (the
	// latest such announcement); overlapped says computeFor is computed so.
	overlapNext int64
	overlapped  bool
	// joining: the step being computed closed without this rank after it
	// had sent a bucket; it joins the step's reduction once computed.
	joining bool
}

// computeDone tells a hybrid rank actor its Compute returned.
type computeDone struct {
	step int64
	took time.Duration
	err  error
}

// NewRankProps returns the props of a rank actor. It drives its Trainer
// step by step: compute the step's gradients (sending each bucket to be
// reduced as the backward pass fills it, unless NoOverlap), finish the
// reduction, apply and commit. A bulk-synchronous step has nothing to decide
// while the generation lasts (every rank of the ring is in every step, and
// the allreduce itself waits for the last one), so it goes from the backward
// pass straight to the reduction's end with no control message; a failure
// fails the ring's collectives, which is how it is detected. A hybrid step is
// decided by the group actor: the rank tells it (StepReady) and reduces on
// its decision (StepGo). A panic in model or optimizer code fails the actor;
// its supervisor restarts it, the new instance repairs the trainer from the
// last in-memory commit (Trainer.Recover) and rejoins at the step the others
// are on, who see one slow step.
func NewRankProps(cfg RankConfig) *actor.Props {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	st := &rankState{cfg: cfg}
	return actor.PropsFromProducer(func() actor.Actor { return &rankActor{st: st} })
}

type rankActor struct{ st *rankState }

// computeNext is the rank's message to itself to start the next step.
type computeNext struct{}

func (a *rankActor) Receive(ctx actor.Context) {
	st := a.st
	switch m := ctx.Message().(type) {
	case *actor.Started:
		st.starts++
		if st.starts > 1 {
			a.resume(ctx)
			return
		}
		ctx.Send(ctx.Self(), &computeNext{})
	case *computeNext:
		if st.cfg.Hybrid {
			a.computeAsync(ctx)
		} else {
			a.compute(ctx)
		}
	case *computeDone:
		a.computed(ctx, m)
	case *phalanxpb.StepGo:
		if st.cfg.Hybrid {
			a.goHybrid(ctx, m)
		} // a bulk-synchronous rank is told nothing: it never asked
	}
}

func (a *rankActor) done(err error) {
	st := a.st
	if st.finished {
		return
	}
	st.finished = true
	if st.cfg.OnDone != nil {
		st.cfg.OnDone(err)
	}
}

// compute runs the next bulk-synchronous step: forward and backward, then
// the rest of the step (finish). A panic inside is re-raised so the
// supervisor sees it and restarts us.
func (a *rankActor) compute(ctx actor.Context) {
	st := a.st
	t := st.cfg.Trainer
	if st.finished {
		return
	}
	if t.State().Step >= st.cfg.Steps {
		a.done(nil)
		return
	}
	compute := t.ComputeOverlapped
	if st.cfg.NoOverlap {
		compute = t.Compute
	}
	if err := compute(st.cfg.Context); err != nil {
		a.fail(err)
		return
	}
	a.finish(ctx)
}

// decided records the wait, from this rank's readiness to now, for step's
// decision: a span of the trace, on thread.
func (a *rankActor) decided(thread, name string, step int64) {
	st := a.st
	if st.cfg.Trace != nil && !st.readyAt.IsZero() {
		st.cfg.Trace.Span(thread, name, st.readyAt, time.Now(), trace.Args{Step: step, Rank: -1})
		st.readyAt = time.Time{}
	}
}

// sendReady tells the group actor this rank has computed step, in took.
func (a *rankActor) sendReady(ctx actor.Context, step int64, took time.Duration) {
	st := a.st
	st.readyAt = time.Now()
	ctx.Send(st.cfg.Group, &phalanxpb.StepReady{Rank: uint32(st.cfg.Rank), Step: step, Generation: st.cfg.Generation,
		From: &phalanxpb.ActorRef{Address: ctx.Self().Address, Id: ctx.Self().Id}, ComputeNanos: int64(took)})
}

// fail ends the rank with err; a panic in model or optimizer code is raised
// again, so that the supervisor restarts the actor.
func (a *rankActor) fail(err error) {
	var pe *PanicError
	if errors.As(err, &pe) {
		a.st.lastFail = pe.Error()
		panic(pe)
	}
	a.done(err)
}

// finish completes a computed bulk-synchronous step: the reduction's end,
// the update and the commit.
func (a *rankActor) finish(ctx actor.Context) {
	stats, err := a.st.cfg.Trainer.Finish(a.st.cfg.Context)
	if err != nil {
		a.fail(err)
		return
	}
	a.stepDone(ctx, stats)
}

func (a *rankActor) stepDone(ctx actor.Context, stats StepStats) {
	if a.afterStep(stats) {
		ctx.Send(ctx.Self(), &computeNext{})
	}
}

// afterStep tells OnStep and AfterStep of a finished step, and reports
// whether the rank goes on (AfterStep may stop or fail it).
func (a *rankActor) afterStep(stats StepStats) bool {
	if a.st.cfg.OnStep != nil {
		a.st.cfg.OnStep(stats)
	}
	if f := a.st.cfg.AfterStep; f != nil {
		stop, err := f(stats)
		switch {
		case err != nil:
			a.done(err)
			return false
		case stop:
			a.done(ErrStopped)
			return false
		}
	}
	return true
}

// resume is a restarted instance's first act: repair the trainer from the
// last commit, tell the group, and carry on where the step protocol stands.
func (a *rankActor) resume(ctx actor.Context) {
	st := a.st
	t := st.cfg.Trainer
	done, stats, err := t.Recover(st.cfg.Context)
	committed, _ := t.State().Committed()
	st.cfg.Logger.Warn("rank actor restarted", zap.Int("rank", st.cfg.Rank), zap.Int("restarts", st.starts-1),
		zap.Int64("committed_step", committed), zap.Error(err))
	restarted := &phalanxpb.RankRestarted{Rank: uint32(st.cfg.Rank), CommittedStep: committed,
		Reason: st.lastFail, Restarts: uint32(st.starts - 1)}
	if st.cfg.OnRestart != nil {
		st.cfg.OnRestart(restarted)
	}
	ctx.Send(st.cfg.Group, restarted)
	switch {
	case err != nil:
		a.done(err)
	case st.cfg.Hybrid:
		// Steps reduced while this rank was late, and decisions deferred
		// behind them, are applied before it computes again; a Compute
		// still running reports when it returns.
		if (!done || a.afterStep(stats)) && !st.computing {
			a.applyAll(ctx)
		}
	case done:
		a.stepDone(ctx, stats)
	default:
		ctx.Send(ctx.Self(), &computeNext{})
	}
}
