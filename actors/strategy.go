package actors

import (
	"fmt"
	"sync"
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
	// Now is the clock that places failures in the Window (time.Now when
	// nil). protoactor's own RestartStatistics reads the wall clock, so the
	// strategy keeps its own record of each child's failures.
	Now    func() time.Time
	Logger *zap.Logger

	mu       sync.Mutex
	failures map[string][]time.Time // by child id: failures within the window
}

var _ actor.SupervisorStrategy = (*Strategy)(nil)

// HandleFailure implements actor.SupervisorStrategy.
func (s *Strategy) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason any, _ any) {
	b := s.Budget
	if b.MaxRestarts <= 0 && b.Window <= 0 {
		b = DefaultBudget()
	}
	rs.Fail() // kept for protoactor's own bookkeeping; the budget reads s.failures
	n := s.recordFailure(child.Id, b.Window)
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

// recordFailure records a failure of child now and returns how many of its
// failures fall within window (every one when window is 0). Failures older
// than the window are forgotten, and so are children whose failures all are.
func (s *Strategy) recordFailure(child string, window time.Duration) int {
	now := time.Now()
	if s.Now != nil {
		now = s.Now()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failures == nil {
		s.failures = map[string][]time.Time{}
	}
	within := func(t time.Time) bool { return window <= 0 || now.Sub(t) < window }
	for id, ts := range s.failures {
		if id != child && !within(ts[len(ts)-1]) {
			delete(s.failures, id)
		}
	}
	kept := s.failures[child][:0]
	for _, t := range s.failures[child] {
		if within(t) {
			kept = append(kept, t)
		}
	}
	kept = append(kept, now)
	s.failures[child] = kept
	return len(kept)
}
