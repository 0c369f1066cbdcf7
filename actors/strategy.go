package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
)

// Budget bounds restarts: more than MaxRestarts failures of one child within
// Window and the supervisor gives up. Restart k (counted from 1 in the window)
// waits Backoff·2^(k-1), at most MaxBackoff.
type Budget struct {
	MaxRestarts int
	Window      time.Duration
	Backoff     time.Duration
	MaxBackoff  time.Duration
}

// DefaultBudget allows 5 restarts a minute, waiting 10 ms, 20 ms, ... up to 1 s.
func DefaultBudget() Budget {
	return Budget{MaxRestarts: 5, Window: time.Minute, Backoff: 10 * time.Millisecond, MaxBackoff: time.Second}
}

// GiveUpError is why a supervisor gave up on a child.
type GiveUpError struct {
	Child    string
	Failures int
	Window   time.Duration
	Reason   any
}

func (e *GiveUpError) Error() string {
	return fmt.Sprintf("actors: %s failed %d times within %s, more than its restart budget; last failure: %v",
		e.Child, e.Failures, e.Window, e.Reason)
}

// Strategy is a one-for-one supervisor strategy: the failed child alone is
// restarted, after an exponential backoff, until its budget is spent; then it
// is stopped and GiveUp is called (the process decides to exit).
type Strategy struct {
	Budget Budget
	// GiveUp is told when a child's budget is spent.
	GiveUp func(*GiveUpError)
	// AfterFunc runs f after d (time.AfterFunc when nil); tests inject a clock.
	AfterFunc func(d time.Duration, f func())
	Logger    *zap.Logger
}

var _ actor.SupervisorStrategy = (*Strategy)(nil)

// HandleFailure implements actor.SupervisorStrategy.
func (s *Strategy) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason any, _ any) {
	b := s.Budget
	if b.MaxRestarts <= 0 && b.Window <= 0 {
		b = DefaultBudget()
	}
	if rs.NumberOfFailures(b.Window) == 0 {
		rs.Reset()
	}
	rs.Fail()
	n := rs.NumberOfFailures(b.Window)
	log := s.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if n > b.MaxRestarts {
		sys.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: actor.StopDirective})
		log.Error("restart budget spent; stopping", zap.String("child", child.Id), zap.Int("failures", n), zap.Any("reason", reason))
		sup.StopChildren(child)
		if s.GiveUp != nil {
			s.GiveUp(&GiveUpError{Child: child.Id, Failures: n, Window: b.Window, Reason: reason})
		}
		return
	}
	delay := b.Backoff << (n - 1)
	if delay > b.MaxBackoff || delay < 0 {
		delay = b.MaxBackoff
	}
	log.Warn("restarting after failure", zap.String("child", child.Id), zap.Int("failures", n),
		zap.Duration("backoff", delay), zap.Any("reason", reason))
	after := s.AfterFunc
	if after == nil {
		after = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	}
	after(delay, func() {
		sys.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: actor.RestartDirective})
		sup.RestartChildren(child)
	})
}
