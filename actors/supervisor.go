package actors

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
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
