package worker

import (
	"context"
	"fmt"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// State is everything a rank needs to continue training: the step count, the
// sampler position, the parameters and the optimizer's slots. Commit copies it
// aside in memory, Restore brings the copy back, Sync makes every rank equal
// to a root's — the semantics of Horovod's elastic State.
type State struct {
	Step     int64
	Position Position

	live  [][]float32 // parameter values, then optimizer slots
	names []string
	saved [][]float32
	sStep int64
	sPos  Position
	has   bool
	// pending: the last commit's copy is not taken yet, the live tensors
	// are still that commit's (see commitLater).
	pending bool
	hdr     []float64
}

// NewState tracks params and the optimizer's slots.
func NewState(params []*nn.Param, opt nn.Optimizer) *State {
	s := &State{hdr: make([]float64, 3)}
	for _, p := range params {
		s.live = append(s.live, p.Value)
		s.names = append(s.names, p.Name)
	}
	for _, t := range opt.Slots() {
		s.live = append(s.live, t.Data)
		s.names = append(s.names, t.Name)
	}
	s.saved = make([][]float32, len(s.live))
	for i, t := range s.live {
		s.saved[i] = make([]float32, len(t))
	}
	return s
}

// Tensors returns the live tensors and their names, parameters first.
func (s *State) Tensors() ([]string, [][]float32) { return s.names, s.live }

// Commit saves the current state in memory.
func (s *State) Commit() {
	s.commitLater()
	s.flush()
}

// commitLater commits the current state, but leaves the copy for flush: the
// trainer takes it while the next step's gradients are being reduced (time a
// rank otherwise spends waiting), and before anything writes the live
// tensors again — the next update, a Sync. Model code only writes gradients
// (see Model), so the live tensors stay the commit's until then.
func (s *State) commitLater() {
	s.sStep, s.sPos, s.has, s.pending = s.Step, s.Position, true, true
}

// flush takes the copy of a commit left for later.
func (s *State) flush() {
	if !s.pending {
		return
	}
	for i, t := range s.live {
		copy(s.saved[i], t)
	}
	s.pending = false
}

// Committed reports the step of the last commit, if any.
func (s *State) Committed() (step int64, ok bool) { return s.sStep, s.has }

// Restore returns to the last commit. It fails when nothing was committed.
func (s *State) Restore() error {
	if !s.has {
		return fmt.Errorf("worker: restore with no committed state")
	}
	if !s.pending { // else the live tensors are still the commit's
		for i, t := range s.live {
			copy(t, s.saved[i])
		}
	}
	s.Step, s.Position = s.sStep, s.sPos
	return nil
}

// Sync makes every rank's state root's: the step, the position, the
// parameters and the optimizer slots are broadcast from root.
func (s *State) Sync(ctx context.Context, g *collective.Group, root int) error {
	s.flush()
	s.hdr[0], s.hdr[1], s.hdr[2] = float64(s.Step), float64(s.Position.Epoch), float64(s.Position.Offset)
	if err := g.Broadcast(ctx, collective.Float64s(s.hdr), root); err != nil {
		return fmt.Errorf("worker: sync state from rank %d: %w", root, err)
	}
	s.Step, s.Position = int64(s.hdr[0]), Position{Epoch: int64(s.hdr[1]), Offset: int64(s.hdr[2])}
	for i, t := range s.live {
		if err := g.Broadcast(ctx, collective.Float32s(t), root); err != nil {
			return fmt.Errorf("worker: sync %s from rank %d: %w", s.names[i], root, err)
		}
	}
	return nil
}
