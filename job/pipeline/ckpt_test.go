package pipeline

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
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
