package actors

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"
)

// Child is one actor a Supervisor starts.
type Child struct {
	Name  string
	Props *actor.Props
}

// supervisorActor starts its children when it starts; their failures are
// handled by the strategy on its props.
type supervisorActor struct {
	children []Child
	started  chan<- []*actor.PID
}

// spawnRequest asks a running supervisor for one more child.
type spawnRequest struct {
	child Child
	reply chan spawnReply
}

type spawnReply struct {
	pid *actor.PID
	err error
}

func (s *supervisorActor) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*spawnRequest); ok {
		pid, err := ctx.SpawnNamed(m.child.Props, m.child.Name)
		m.reply <- spawnReply{pid, err}
		return
	}
	if _, ok := ctx.Message().(*actor.Started); !ok {
		return
	}
	pids := make([]*actor.PID, 0, len(s.children))
	for _, c := range s.children {
		pid, err := ctx.SpawnNamed(c.Props, c.Name)
		if err != nil {
			panic(fmt.Sprintf("actors: starting %s: %v", c.Name, err))
		}
		pids = append(pids, pid)
	}
	select { // only the first start is reported; a restarted supervisor's is not
	case s.started <- pids:
	default:
	}
}

// StartSupervisor spawns, under the name name, a supervisor that owns
// children under strategy, and returns its PID and the children's, in order.
func StartSupervisor(sys *System, name string, strategy actor.SupervisorStrategy, children ...Child) (*actor.PID, []*actor.PID, error) {
	started := make(chan []*actor.PID, 1)
	props := actor.PropsFromProducer(func() actor.Actor {
		return &supervisorActor{children: children, started: started}
	}, actor.WithSupervisor(strategy))
	pid, err := sys.Root.SpawnNamed(props, name)
	if err != nil {
		return nil, nil, fmt.Errorf("actors: starting supervisor %s: %w", name, err)
	}
	return pid, <-started, nil
}

// SpawnChild starts one more child under a running supervisor (in this
// process), supervised like the first ones: a rank actor for each new
// generation, say.
func SpawnChild(ctx context.Context, sys *System, supervisor *actor.PID, c Child) (*actor.PID, error) {
	reply := make(chan spawnReply, 1)
	sys.Root.Send(supervisor, &spawnRequest{child: c, reply: reply})
	var r spawnReply
	select {
	case r = <-reply:
	case <-ctx.Done():
		return nil, fmt.Errorf("actors: starting %s: %w", c.Name, ctx.Err())
	}
	if r.err != nil {
		return nil, fmt.Errorf("actors: starting %s: %w", c.Name, r.err)
	}
	return r.pid, nil
}

// StopChild stops a child and waits until it has stopped.
func StopChild(sys *System, pid *actor.PID) error {
	return sys.Root.StopFuture(pid).Wait()
}

// Supervisor is how every Phalanx process supervises its actors (a
// worker's group and rank actors, a parameter server's shard actors): one
// supervisor under Strategy with a restart budget; a child that spends it
// is reported on GaveUp, and the process decides to exit.
type Supervisor struct {
	sys    *System
	pid    *actor.PID
	gaveUp chan *GiveUpError
}

// Supervise starts a supervisor named name over children, restarting each
// within budget; log is told of every decision.
func Supervise(sys *System, name string, budget Budget, log *zap.Logger, children ...Child) (*Supervisor, []*actor.PID, error) {
	s := &Supervisor{sys: sys, gaveUp: make(chan *GiveUpError, 1)}
	strategy := &Strategy{Budget: budget, Logger: log, GiveUp: func(e *GiveUpError) {
		select {
		case s.gaveUp <- e:
		default: // the first is enough to end the process
		}
	}}
	pid, pids, err := StartSupervisor(sys, name, strategy, children...)
	if err != nil {
		return nil, nil, err
	}
	s.pid = pid
	return s, pids, nil
}

// Spawn starts one more child, supervised like the first ones.
func (s *Supervisor) Spawn(ctx context.Context, c Child) (*actor.PID, error) {
	return SpawnChild(ctx, s.sys, s.pid, c)
}

// Stop stops one child and waits until it has stopped.
func (s *Supervisor) Stop(pid *actor.PID) error { return StopChild(s.sys, pid) }

// GaveUp delivers the first child failure beyond the restart budget.
func (s *Supervisor) GaveUp() <-chan *GiveUpError { return s.gaveUp }

// Close stops the supervisor and its children.
func (s *Supervisor) Close() error { return StopChild(s.sys, s.pid) }
