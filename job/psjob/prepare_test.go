package psjob

import (
	"errors"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// TestPrepare: a parameter-server launch is checked, and its job record
// made, before anything starts; each bad setting is a ConfigError naming
// its field.
func TestPrepare(t *testing.T) {
	spec := job.ModelSpec{Name: "lr", PS: &job.PSModel{
		Tables: func(job.Options, string, float32) ([]*phalanxpb.PSTable, error) {
			return []*phalanxpb.PSTable{{Id: 1, Name: "w", Dim: 1, Rows: 10, Optimizer: "sgd", Lr: 0.1}}, nil
		},
		Steps: func(_ job.Options, workers, batch int) (int64, error) { return int64(1000 / (workers * batch)), nil },
	}}
	cases := []struct {
		name  string
		edit  func(*job.LaunchConfig)
		field string // "" : accepted
	}{
		{"defaults", func(*job.LaunchConfig) {}, ""},
		{"no servers", func(lc *job.LaunchConfig) { lc.PS.Servers = 0 }, "PS.Servers"},
		{"as many replicas as servers", func(lc *job.LaunchConfig) { lc.PS.Replicas = 2 }, "PS.Replicas"},
		{"checkpoints by time", func(lc *job.LaunchConfig) { lc.Checkpoint.Location, lc.Checkpoint.Every = t.TempDir(), 1e9 }, "Checkpoint.Every"},
		{"a batch smaller than the workers", func(lc *job.LaunchConfig) { lc.Batch = 1 }, "Batch"},
		{"an unknown sync mode", func(lc *job.LaunchConfig) { lc.Sync.Mode = "eventual" }, "Sync.Mode"},
		{"asp", func(lc *job.LaunchConfig) { lc.Sync.Mode = job.Async }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lc := job.DefaultLaunchConfig()
			lc.Model, lc.Batch = "lr", 8
			tc.edit(&lc)
			j, err := Kind{}.Prepare(testwait.Context(t, time.Minute), &lc, spec, job.Options{})
			var ce *job.ConfigError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.field == "":
				rec := j.(prepared).rec
				if rec.Workers != 2 || rec.Batch != 4 || rec.Steps != 125 || rec.Shards != 2 {
					t.Fatalf("job record: %d workers, batch %d, %d steps, %d shards; want 2, 4, 125, 2", rec.Workers, rec.Batch, rec.Steps, rec.Shards)
				}
			case !errors.As(err, &ce) || ce.Field != tc.field:
				t.Fatalf("got %v, want a ConfigError naming %s", err, tc.field)
			}
		})
	}
}
