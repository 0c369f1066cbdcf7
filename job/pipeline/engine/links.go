package engine

import (
	"context"
	"fmt"
	"sync"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/job/pipeline/schedule"
)

// groupLink is one direction of a link: a two-rank collective group whose
// rank 0 only sends and rank 1 only receives, so that a stage's sends and
// receives to one peer never wait on each other's turn in the group.
type groupLink struct {
	g    *collective.Group
	peer int
}

func (l groupLink) Send(ctx context.Context, data []float32) error {
	return l.g.Send(ctx, l.peer, collective.Float32s(data))
}

func (l groupLink) Recv(ctx context.Context, data []float32) error {
	return l.g.Recv(ctx, l.peer, collective.Float32s(data))
}

// LinkSpec places a stage in its pipeline for Connect.
type LinkSpec struct {
	// Job names the pipeline's groups: every link's group is
	// Job/act.a>b or Job/grad.a>b, so the data plane fences them by
	// job, pipeline and generation.
	Job        string
	Generation uint64
	Schedule   schedule.Config
	Stage      int
	// Addrs are the data-plane addresses of the pipeline's stages, by
	// stage.
	Addrs   []string
	Options collective.Options
}

// Connected are a stage's links and the groups under them.
type Connected struct {
	Links  Links
	groups []*collective.Group
}

// Close closes the groups, all at once: a healthy group's Close waits
// for its peer's goodbye, and the peer may be closing its other groups
// first.
func (c *Connected) Close() {
	var wg sync.WaitGroup
	for _, g := range c.groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Close()
		}()
	}
	wg.Wait()
}

// Abort fails every link's pending and later operations.
func (c *Connected) Abort(reason string) {
	for _, g := range c.groups {
		g.Abort(reason)
	}
}

// Connect joins, through t, the groups of every link the stage's schedule
// sends or receives on, all at once (each waits for its peer).
func Connect(ctx context.Context, t collective.Transport, s LinkSpec) (*Connected, error) {
	list, err := schedule.Build(s.Schedule, s.Stage)
	if err != nil {
		return nil, err
	}
	p := s.Schedule.Stages
	if len(s.Addrs) != p {
		return nil, fmt.Errorf("pipeline: %d stage addresses for %d stages", len(s.Addrs), p)
	}
	type dir struct {
		from, to int
		grad     bool
	}
	need := map[dir]bool{}
	for _, in := range list {
		switch in.Op {
		case schedule.SendAct, schedule.SendGrad:
			need[dir{s.Stage, in.Peer, in.Op == schedule.SendGrad}] = true
		case schedule.RecvAct, schedule.RecvGrad:
			need[dir{in.Peer, s.Stage, in.Op == schedule.RecvGrad}] = true
		}
	}
	c := &Connected{Links: Links{ActOut: make([]Sender, p), GradOut: make([]Sender, p),
		ActIn: make([]Receiver, p), GradIn: make([]Receiver, p)}}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for d := range need {
		kind := "act"
		if d.grad {
			kind = "grad"
		}
		rank := 0
		if d.to == s.Stage {
			rank = 1
		}
		m := collective.Membership{Job: fmt.Sprintf("%s/%s.%d>%d", s.Job, kind, d.from, d.to), Generation: s.Generation,
			Rank: rank, Peers: []string{s.Addrs[d.from], s.Addrs[d.to]}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := collective.Join(ctx, t, m, s.Options)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("pipeline link %s: %w", m.Job, err))
				return
			}
			c.groups = append(c.groups, g)
			l := groupLink{g: g, peer: 1 - rank}
			switch {
			case rank == 0 && !d.grad:
				c.Links.ActOut[d.to] = l
			case rank == 0:
				c.Links.GradOut[d.to] = l
			case !d.grad:
				c.Links.ActIn[d.from] = l
			default:
				c.Links.GradIn[d.from] = l
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		c.Close()
		return nil, errs[0]
	}
	return c, nil
}
