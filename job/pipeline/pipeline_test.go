package pipeline

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/pipeline/layout"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// tiny is a pipeline model of n Dense+ReLU pairs of width 4.
func tiny(n int) *Model {
	return &Model{
		Layers: func(job.Options) ([]Layer, error) {
			var ls []Layer
			for i := range n {
				ls = append(ls, Layer{Name: fmt.Sprintf("fc%d", i), Params: 20, In: 4, Out: 4}, Layer{Name: fmt.Sprintf("relu%d", i), In: 4, Out: 4})
			}
			return ls, nil
		},
		Build: func(_ job.Options, seed uint64, from, to int) ([]nn.Layer, error) {
			var out []nn.Layer
			for i := from; i < to; i++ {
				if i%2 == 1 {
					out = append(out, &nn.ReLU{})
					continue
				}
				out = append(out, nn.NewDense(fmt.Sprintf("fc%d", i/2), 4, 4, rand.New(rand.NewPCG(seed, uint64(i)))))
			}
			return out, nil
		},
		Data: func(job.Options, uint64) (worker.Dataset, worker.Dataset, error) { return nil, nil, nil },
	}
}

// check refuses each bad configuration naming its field, and fills in
// the defaults of a good one.
func TestCheck(t *testing.T) {
	good := func() job.Config {
		c := job.DefaultConfig()
		c.Model, c.Batch, c.MicroBatches = "tiny", 64, 4
		c.Pipeline = job.PipelineConfig{Stages: 2, Replicas: 2, Schedule: "1f1b", Balance: "params"}
		return c
	}
	for _, c := range []struct {
		name  string
		edit  func(*job.Config)
		field string
	}{
		{"no stages", func(c *job.Config) { c.Pipeline.Stages = 0 }, "Pipeline.Stages"},
		{"no replicas", func(c *job.Config) { c.Pipeline.Replicas = 0 }, "Pipeline.Replicas"},
		{"schedule", func(c *job.Config) { c.Pipeline.Schedule = "pipedream" }, "Pipeline.Schedule"},
		{"batch over replicas", func(c *job.Config) { c.Batch = 63 }, "Batch"},
		{"micro-batches", func(c *job.Config) { c.MicroBatches = 5 }, "MicroBatches"},
		{"hybrid", func(c *job.Config) { c.Sync.Mode = "hybrid" }, "Sync.Mode"},
		{"balance", func(c *job.Config) { c.Pipeline.Balance = "flops" }, "Pipeline.Balance"},
		{"cuts past the model", func(c *job.Config) { c.Pipeline.Cuts = []int{9} }, "Pipeline.Cuts"},
		{"a cut list of the wrong length", func(c *job.Config) { c.Pipeline.Cuts = []int{2, 4} }, "Pipeline.Cuts"},
		{"more stages than layers", func(c *job.Config) { c.Pipeline.Stages = 9 }, "Pipeline.Stages"},
		{"interleaved on one stage", func(c *job.Config) { c.Pipeline.Stages, c.Pipeline.Schedule = 1, "interleaved" }, "Pipeline"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good()
			c.edit(&cfg)
			_, err := check(&cfg, tiny(4), nil)
			if ce, ok := err.(*job.ConfigError); !ok || ce.Field != c.field {
				t.Fatalf("check: %v, want a ConfigError of %s", err, c.field)
			}
		})
	}
	cfg := good()
	sh, err := check(&cfg, tiny(4), nil)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(cfg.Pipeline.Cuts) != "[4]" || sh.rows != 8 || sh.chunks != 1 {
		t.Errorf("cuts %v, rows %d, chunks %d; want [4], 8, 1", cfg.Pipeline.Cuts, sh.rows, sh.chunks)
	}
}

// layoutReport names the lost stages of each dropped replica.
func TestLayoutReport(t *testing.T) {
	members := []layout.Member{{Replica: 0, Stage: 0, Gen: 3, Step: 9}, {Replica: 0, Stage: 1, Gen: 3, Step: 9}, {Replica: 1, Stage: 0, Gen: 3, Step: 9}}
	lay, err := layout.Plan(members, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	rep := layoutReport(4, lay, members, 2)
	if fmt.Sprint(rep.Lost) != "[[1 1]]" || fmt.Sprint(rep.Dropped) != "[1]" || rep.Spares != 1 || rep.Replicas != 1 {
		t.Errorf("report %+v, want stage 1 of replica 1 lost, replica 1 dropped, one spare, one replica", rep)
	}
}
