package worker

import (
	"slices"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/nn"
)

// TestStateCommitRestoreSync: Restore returns to the commit; Sync makes every
// rank root's, optimizer slots, step and position included.
func TestStateCommitRestoreSync(t *testing.T) {
	ctx := testContext(t)
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
		if err := testwait.Recv(t, errs, time.Minute, "a rank's Sync"); err != nil {
			t.Fatal(err)
		}
	}
	for r := range states {
		if params[r].Value[3] != 23 || opts[r].Slots()[0].Data[1] != 2 || states[r].Step != 2 || states[r].Position != (Position{Epoch: 2, Offset: 14}) {
			t.Errorf("rank %d after sync: %v, slot %v, step %d, position %+v", r, params[r].Value, opts[r].Slots()[0].Data[1], states[r].Step, states[r].Position)
		}
	}
}

// TestStateCommitLater: a commit whose copy is left for later is a commit
// like any other: reported at once, restored (the live tensors are still
// its), taken by flush before the tensors change, and by Sync.
func TestStateCommitLater(t *testing.T) {
	ctx := testContext(t)
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, s *State, p *nn.Param) // after commitLater at step 3 with w[0] = 1
		want float32                                   // w[0] after Restore
		step int64
	}{
		{"restored before the copy", func(t *testing.T, s *State, p *nn.Param) { s.Step = 4 }, 1, 3},
		{"flushed, then changed", func(t *testing.T, s *State, p *nn.Param) { s.flush(); p.Value[0], s.Step = 5, 4 }, 1, 3},
		{"synced", func(t *testing.T, s *State, p *nn.Param) {
			groups, err := collective.InprocGroups(ctx, 1, "later", 1, collective.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer collective.CloseGroups(groups)
			if err := s.Sync(ctx, groups[0], 0); err != nil {
				t.Fatal(err)
			}
			p.Value[0] = 7
		}, 1, 3},
		{"committed again", func(t *testing.T, s *State, p *nn.Param) { p.Value[0], s.Step = 6, 4; s.Commit(); p.Value[0] = 8 }, 6, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := nn.NewParam("w", 2)
			opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum"}, []*nn.Param{p})
			s := NewState([]*nn.Param{p}, opt)
			p.Value[0], s.Step = 1, 3
			s.commitLater()
			if c, ok := s.Committed(); !ok || c != 3 {
				t.Fatalf("committed %d %v, want step 3", c, ok)
			}
			tc.do(t, s, p)
			if err := s.Restore(); err != nil {
				t.Fatal(err)
			}
			if p.Value[0] != tc.want || s.Step != tc.step {
				t.Fatalf("restored w[0] %v at step %d, want %v at %d", p.Value[0], s.Step, tc.want, tc.step)
			}
		})
	}
}

// TestResumeEqualsContinuing: ranks given a copy of step 6's parameters and
// optimizer slots (a checkpoint) and resumed at step 6 end step 12 bitwise as
// the ranks that trained through.
func TestResumeEqualsContinuing(t *testing.T) {
	cfg := Config{GlobalBatch: 60, BucketBytes: 128, Schedule: nn.Schedule{Base: 0.05}, Seed: 5}
	through := newHybridRanks(t, 3, cfg)
	mustSteps(t, through, 6)
	_, live := through[0].State().Tensors()
	snap := make([][]float32, len(live))
	for i, x := range live {
		snap[i] = slices.Clone(x)
	}
	pos := through[0].State().Position
	mustSteps(t, through, 6)
	resumed := newHybridRanks(t, 3, cfg)
	for _, tr := range resumed {
		_, live := tr.State().Tensors()
		for i, x := range live {
			copy(x, snap[i])
		}
		if err := tr.Restored(6, pos); err != nil {
			t.Fatal(err)
		}
	}
	mustSteps(t, resumed, 6)
	for r := range resumed {
		if !sameBits(paramsOf(through[r]), paramsOf(resumed[r])) {
			t.Fatalf("rank %d: resumed parameters differ from those trained through", r)
		}
	}
}

// savedTensors returns the commit's copy.
func (s *State) savedTensors() ([]string, [][]float32) { return s.names, s.saved }
