package worker

import (
	"context"
	"fmt"

	"github.com/phalanx-rt/phalanx/collective"
)

// Resynced is the outcome of Trainer.Resync.
type Resynced struct {
	Step int64 // the step every rank continues from
	Root int   // the rank whose state was taken
	// Redone counts the steps a rank of this group had completed that are
	// lost and will be trained again. A step only a lost rank completed
	// (it finished the step's allreduce first and died) is not counted.
	Redone int64
	// Last holds the figures (loss, accuracy, samples, position,
	// fingerprint, and the world, generation and participants of the ring
	// that trained it) of step Step as the root computed them, when the root
	// trained it; its Step is 0 otherwise. A progress reporter that never
	// saw that step (its reporter was aborted before) can report it now.
	Last StepStats
}

// maxRanks bounds the rank encoded next to the step in Resync's key.
const maxRanks = 1 << 16

// Resync makes every rank of a freshly built group (a new generation) start
// from the same state: the newest commit among them, taken from the lowest
// rank that holds it, with parameters, optimizer slots and sampler position
// sent over the data plane. reached is the step this rank had completed
// before the group changed (before Rollback); a rank without a commit (a
// newcomer) passes 0 and receives everything. The chosen state is committed
// on every rank.
func (t *Trainer) Resync(ctx context.Context, reached int64) (Resynced, error) {
	g := t.g
	if g.Size() > maxRanks {
		return Resynced{}, fmt.Errorf("worker: resync of %d ranks: at most %d", g.Size(), maxRanks)
	}
	step := int64(-1)
	if c, ok := t.state.Committed(); ok && t.state.Step == c && t.phase == phaseIdle {
		step = c
	}
	// The highest step wins, and among equals the lowest rank: one max.
	key := []float64{float64((step+1)*maxRanks + int64(maxRanks-1-g.Rank())), float64(reached)}
	if err := g.AllReduce(ctx, collective.Float64s(key), collective.Max); err != nil {
		return Resynced{}, fmt.Errorf("worker: choosing the state to resume from: %w", err)
	}
	k := int64(key[0])
	best, root := k/maxRanks-1, int(maxRanks-1-k%maxRanks)
	if best < 0 {
		return Resynced{}, fmt.Errorf("worker: no rank of generation %d has committed state to resume from", g.Generation())
	}
	if err := t.state.Sync(ctx, g, root); err != nil {
		return Resynced{}, err
	}
	c := &t.committed
	if c.Step != t.state.Step {
		*c = StepStats{}
	}
	v := append(t.lastBuf[:0], float64(c.Step), c.Loss, c.Accuracy, float64(c.Samples), float64(c.Position.Epoch), float64(c.Position.Offset),
		float64(c.World), float64(c.Participants), float64(c.Generation))
	v = append(v, c.Fingerprint[:]...)
	t.lastBuf = v
	if err := g.Broadcast(ctx, collective.Float64s(v), root); err != nil {
		return Resynced{}, fmt.Errorf("worker: resync statistics from rank %d: %w", root, err)
	}
	*c = StepStats{Step: int64(v[0]), Loss: v[1], Accuracy: v[2], Samples: int(v[3]),
		Position: Position{Epoch: int64(v[4]), Offset: int64(v[5])}, Epoch: int64(v[4]),
		World: int(v[6]), Participants: int(v[7]), Generation: uint64(v[8])}
	copy(c.Fingerprint[:], v[9:])
	t.state.Commit()
	t.phase = phaseIdle
	return Resynced{Step: t.state.Step, Root: root, Redone: max(0, int64(key[1])-t.state.Step), Last: *c}, nil
}
