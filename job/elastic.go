package job

import (
	"context"
	"fmt"
	"os"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Elastic is what the launcher of a kind whose workers the coordinator
// places runs beside them: the job's coordinator (unless
// LaunchConfig.NoCoordinator), deciding its generations within the
// launch's bounds, and a follower reading the generations back from etcd.
type Elastic struct {
	// Generations delivers every generation decided, in order.
	Generations <-chan *phalanxpb.Generation
	// Ended delivers how the coordinator ended, once (never without one).
	Ended <-chan error
	// followed and decided close when the follower and the coordinator
	// have returned.
	followed, decided <-chan struct{}
}

// StartElastic starts the job's coordinator and follows its generations
// until ctx ends; Wait waits for both, and must be called (once ctx has
// ended) before the job's etcd client closes.
func (e *Env) StartElastic(ctx context.Context) (*Elastic, error) {
	lc := e.LC
	decided := make(chan struct{})
	ended := make(chan error, 1)
	if lc.NoCoordinator {
		close(decided)
	} else {
		host, _ := os.Hostname()
		co, err := coordinator.New(e.Coord, coordinator.Config{ID: fmt.Sprintf("%s-%d", host, os.Getpid()),
			Rendezvous: coordinator.Rendezvous{MinWorkers: lc.MinWorkers, MaxWorkers: lc.MaxWorkers},
			JoinWindow: lc.JoinWindow, MinWorkersTimeout: lc.MinWorkersTimeout, SessionTTL: lc.LeaseTTL, Logger: e.Log.Named("coordinator"),
			FirstRing: lc.Workers, FirstRingWait: lc.MinWorkersTimeout, Probe: probeWorker(e.Sec)})
		if err != nil {
			return nil, err
		}
		go func() {
			defer close(decided)
			ended <- co.Run(ctx)
		}()
	}
	gens := make(chan *phalanxpb.Generation, 16)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		elastic.Follow(ctx, e.Coord, e.Log, func(g *phalanxpb.Generation) {
			select {
			case gens <- g:
			case <-ctx.Done():
			}
		})
	}()
	return &Elastic{Generations: gens, Ended: ended, followed: followed, decided: decided}, nil
}

// Wait waits for the coordinator and the follower to return (their
// context ended).
func (el *Elastic) Wait() {
	<-el.followed
	<-el.decided
}
