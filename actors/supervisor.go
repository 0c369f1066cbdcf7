package actors

import (
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

func (s *supervisorActor) Receive(ctx actor.Context) {
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
