package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/phalanx-rt/phalanx/coordinator"
)

// ErrNoJob: etcd holds neither a status nor a generation of the job.
var ErrNoJob = errors.New("status: no such job in etcd (no published status, no generation)")

// Fetch reads a job's status from its etcd: the snapshot its launcher
// published last, or, with no launcher publishing it (workers started by
// hand), what the coordinator's generation record says: the ring.
func Fetch(ctx context.Context, coord *coordinator.Job) (Snapshot, error) {
	b, _, err := coord.ReadStatus(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	if b != nil {
		var s Snapshot
		if err := json.Unmarshal(b, &s); err != nil {
			return Snapshot{}, fmt.Errorf("status: the job's published status is not a snapshot: %w", err)
		}
		return s, nil
	}
	g, _, err := coord.CurrentGeneration(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	if g == nil {
		return Snapshot{}, ErrNoJob
	}
	s := Snapshot{Source: "etcd", State: "unknown: no launcher publishes this job's status", Generation: g.Number,
		World: len(g.Members), Step: g.StartStep, Updated: time.Now()}
	if g.Stopped {
		s.State = "stopped"
	}
	for i, m := range g.Members {
		s.Ring = append(s.Ring, Member{Rank: i, ID: m.Id, Pid: int(m.Pid), Worker: -1})
	}
	s.Generations = []Generation{{Number: g.Number, World: len(g.Members), Reason: g.Reason, Step: g.StartStep}}
	return s, nil
}

// Remote is a job's status read from its etcd every period (Follow): a
// Source for a status page served away from the launcher.
type Remote struct {
	mu      sync.Mutex
	snap    Snapshot
	err     error
	version uint64
	changed chan struct{}
}

// Follow reads coord's job's status now and every period until ctx ends.
// A read that fails keeps the last snapshot and says why in its State.
func Follow(ctx context.Context, coord *coordinator.Job, period time.Duration) (*Remote, error) {
	r := &Remote{changed: make(chan struct{})}
	s, err := Fetch(ctx, coord)
	if err != nil {
		return nil, err
	}
	r.set(s, nil)
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(ctx, period+5*time.Second)
			s, err := Fetch(rctx, coord)
			cancel()
			r.set(s, err)
		}
	}()
	return r, nil
}

func (r *Remote) set(s Snapshot, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if r.err == nil || r.err.Error() != err.Error() {
			r.err = err
			r.snap.State = "unreachable: " + err.Error()
			r.bump()
		}
		return
	}
	r.err = nil
	if s.Updated.Equal(r.snap.Updated) && s.State == r.snap.State && s.Generation == r.snap.Generation {
		return
	}
	r.snap = s
	r.bump()
}

func (r *Remote) bump() {
	r.version++
	close(r.changed)
	r.changed = make(chan struct{})
}

// Snapshot is the last status read.
func (r *Remote) Snapshot() (Snapshot, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.snap, r.version
}

// Changed closes at the first change after version v.
func (r *Remote) Changed(v uint64) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v != r.version {
		c := make(chan struct{})
		close(c)
		return c
	}
	return r.changed
}
