package pipeline

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/nn"
)

// A pipeline stage restores from whichever is newer, the newest index of
// stage parts or a ring checkpoint of the same model (a data-parallel
// run's, resumed pipelined), each tensor by name; a ring checkpoint of
// another model is refused, and one lacking a stage's tensor names it.
func TestRestoreStageFromEitherFormat(t *testing.T) {
	ring := func(f *retainFixture, model string, step int64, tensors ...checkpoint.Tensor) {
		f.t.Helper()
		ck, err := checkpoint.New(checkpoint.Config{Store: f.store, Job: "retain-test", Model: model, Seed: 7, Wait: time.Minute}, tensors)
		if err != nil {
			f.t.Fatal(err)
		}
		defer ck.Close(f.ctx)
		if _, err := ck.SaveAlone(f.ctx, checkpoint.Progress{Step: step, Epoch: 2, Offset: 8}, 1); err != nil {
			f.t.Fatal(err)
		}
	}
	w := func(name string, v ...float32) checkpoint.Tensor {
		return checkpoint.Tensor{Name: name, Role: "parameter", Shape: []int64{2}, Data: v}
	}
	for _, tc := range []struct {
		name  string
		setup func(f *retainFixture)
		kind  string    // the source restored from
		step  int64     // its step
		want  []float32 // stage 1's fc1.W after the restore
		err   string
	}{
		{"a newer ring checkpoint", func(f *retainFixture) {
			f.saveIndexed(2, 10)
			ring(f, "tiny", 20, w("fc0.W", 3, 4), w("fc1.W", 5, 6))
		}, "ring", 20, []float32{5, 6}, ""},
		{"a newer index", func(f *retainFixture) {
			ring(f, "tiny", 5, w("fc0.W", 3, 4), w("fc1.W", 5, 6))
			f.saveIndexed(2, 10)
		}, "pipeline", 10, []float32{1, 1}, ""},
		{"a ring checkpoint alone", func(f *retainFixture) {
			ring(f, "tiny", 20, w("fc0.W", 3, 4), w("fc1.W", 5, 6))
		}, "ring", 20, []float32{5, 6}, ""},
		{"another model's ring checkpoint", func(f *retainFixture) {
			f.saveIndexed(2, 10)
			ring(f, "other", 20, w("fc0.W", 3, 4), w("fc1.W", 5, 6))
		}, "", 0, nil, `model "other"`},
		{"a ring checkpoint lacking the stage's tensor", func(f *retainFixture) {
			ring(f, "tiny", 20, w("fc0.W", 3, 4))
		}, "ring", 20, nil, `no tensor "fc1.W"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			f := newRetainFixture(t, ctx)
			tc.setup(f)
			src, err := newestSource(ctx, f.store, f.config(2), func(name string, err error) { t.Errorf("skipped %s: %v", name, err) })
			if err == nil && src != nil {
				if src.Kind != tc.kind || src.Index.Step != tc.step {
					t.Fatalf("restoring from %s checkpoint %s of step %d, want a %s one of step %d", src.Kind, src.ID, src.Index.Step, tc.kind, tc.step)
				}
				p := nn.NewParam("fc1.W", 2)
				st := &stageState{stage: 1, params: []*nn.Param{p}}
				st.opt, _ = nn.NewOptimizer(nn.OptimizerConfig{Kind: "sgd"}, st.params)
				if err = restoreStage(ctx, src, st); err == nil && !slices.Equal(p.Value, tc.want) {
					t.Errorf("fc1.W restored as %v, want %v", p.Value, tc.want)
				}
			}
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("restore: %v, want %q", err, tc.err)
			}
		})
	}
}

// gatedStore holds back every Put while its gate is closed: a save that
// is still being stored.
type gatedStore struct {
	checkpoint.Store
	gate chan struct{}
}

func (g *gatedStore) Put(ctx context.Context, name string, data []byte) error {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Store.Put(ctx, name, data)
}

// TestFinalCheckpointIndexesTheSaveInFlight: a periodic save still being
// stored when the job reaches its last step is finished and indexed
// before the final checkpoint, not dropped: a relaunch that finds the
// final one corrupt falls back on it (the CI's TP resharding test once
// found no step-10 index on a loaded machine).
func TestFinalCheckpointIndexesTheSaveInFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := checkpoint.NewLocalStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store := &gatedStore{Store: dir, gate: make(chan struct{})}
	c := job.DefaultConfig()
	c.Job, c.Model, c.Seed, c.Steps = "final-test", "tiny", 7, 20
	c.Pipeline = job.PipelineConfig{Stages: 1, Replicas: 1}
	c.Checkpoint.EverySteps = 10
	st := &stageState{params: []*nn.Param{{Name: "fc0.W", Shape: []int{2}, Value: []float32{1, 2}, Grad: make([]float32, 2)}}}
	st.opt, err = nn.NewOptimizer(nn.OptimizerConfig{Kind: "sgd"}, st.params)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var saved []int64
	w := &pipeWorker{cfg: c, log: zap.NewNop(), store: store, step: 20, gen: 1,
		rep: job.NewReporter(func(r job.Report) {
			if ck, ok := r.(job.Checkpoint); ok && ck.Checkpoint.Kind == "saved" {
				mu.Lock()
				saved = append(saved, ck.Step)
				mu.Unlock()
			}
		})}
	sv, err := newSaver(store, &c, 1, 0, st, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	rd := &roundState{saver: sv}
	sv.start(10, 0, 640, 1) // step 10's save, held back
	done := make(chan error, 1)
	go func() { done <- w.finalCheckpoint(ctx, rd) }()
	close(store.gate)
	if err := testwait.Recv(t, done, time.Minute, "the final checkpoint"); err != nil {
		t.Fatal(err)
	}
	w.indexing.Wait()
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(saved, []int64{10, 20}) {
		t.Errorf("checkpoints saved (indexed) of steps %v, want [10 20]", saved)
	}
	for _, step := range []int64{10, 20} {
		if _, err := indexOf(ctx, store, &c, step, [2]int64{}, 1); err != nil {
			t.Errorf("step %d: %v", step, err)
		}
	}
}
