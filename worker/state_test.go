package worker

import (
	"context"
	"testing"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// TestStateCommitRestoreSync: Restore returns to the commit; Sync makes every
// rank root's, optimizer slots, step and position included.
func TestStateCommitRestoreSync(t *testing.T) {
	ctx := context.Background()
	groups, err := collective.InprocGroups(ctx, 3, "state", 1, collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer collective.CloseGroups(groups)
	states := make([]*State, 3)
	params := make([]*nn.Param, 3)
	opts := make([]nn.Optimizer, 3)
	for r := range states {
		params[r] = nn.NewParam("w", 4)
		opts[r], _ = nn.NewOptimizer(nn.OptimizerConfig{Kind: "adam"}, []*nn.Param{params[r]})
		states[r] = NewState([]*nn.Param{params[r]}, opts[r])
		for i := range params[r].Value {
			params[r].Value[i] = float32(10*r + i)
		}
		opts[r].Slots()[0].Data[1] = float32(r)
		states[r].Step, states[r].Position = int64(r), Position{Epoch: int64(r), Offset: int64(7 * r)}
	}
	s := states[1]
	if err := s.Restore(); err == nil {
		t.Error("restore without a commit succeeded")
	}
	s.Commit()
	params[1].Value[0], s.Step = -1, 99
	if err := s.Restore(); err != nil || params[1].Value[0] != 10 || s.Step != 1 {
		t.Errorf("after restore: value %v step %d (%v)", params[1].Value[0], s.Step, err)
	}
	errs := make(chan error, 3)
	for r := range states {
		go func() { errs <- states[r].Sync(ctx, groups[r], 2) }()
	}
	for range states {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for r := range states {
		if params[r].Value[3] != 23 || opts[r].Slots()[0].Data[1] != 2 || states[r].Step != 2 || states[r].Position != (Position{Epoch: 2, Offset: 14}) {
			t.Errorf("rank %d after sync: %v, slot %v, step %d, position %+v", r, params[r].Value, opts[r].Slots()[0].Data[1], states[r].Step, states[r].Position)
		}
	}
}
