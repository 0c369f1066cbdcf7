package pipeline

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/pipeline/cut"
	"github.com/phalanx-rt/phalanx/job/pipeline/schedule"
)

// shape is what a job's configuration and model fix for every process:
// the model's layers, the layer range of each virtual stage, and the
// sizes of a replica's share of a step and of its micro-batches.
type shape struct {
	layers       []Layer
	chunks       int      // v, model chunks per stage
	ranges       [][2]int // per virtual stage j = chunk·P + stage: its layers [from, to)
	replicaBatch int      // samples of a replica per step
	rows         int      // samples per micro-batch
	per          int      // rows per sample (Model.SampleRows)
}

// check validates a pipeline job's configuration against its model and
// fills in its defaults (Pipeline.Chunks, Pipeline.Cuts by parameter
// count when none are given and Balance is "params"); the first problem
// is returned as a *job.ConfigError naming the field.
func check(c *job.Config, m *Model, o job.Options) (*shape, error) {
	if err := c.ValidateCommon(); err != nil {
		return nil, err
	}
	p := &c.Pipeline
	kind, err := schedule.ParseKind(p.Schedule)
	if err != nil {
		return nil, job.Invalid("Pipeline.Schedule", p.Schedule, "%v", err)
	}
	if p.Chunks == 0 {
		p.Chunks = 1
		if kind == schedule.Interleaved {
			p.Chunks = 2
		}
	}
	switch {
	case p.Stages < 1:
		return nil, job.Invalid("Pipeline.Stages", p.Stages, "want at least 1")
	case p.Replicas < 1:
		return nil, job.Invalid("Pipeline.Replicas", p.Replicas, "want at least 1")
	case c.MicroBatches < 1:
		return nil, job.Invalid("MicroBatches", c.MicroBatches, "want at least 1")
	case c.Batch < 1 || c.Batch%p.Replicas != 0:
		return nil, job.Invalid("Batch", c.Batch, "want a positive multiple of the %d replicas (--dp)", p.Replicas)
	case (c.Batch/p.Replicas)%c.MicroBatches != 0:
		return nil, job.Invalid("MicroBatches", c.MicroBatches, "does not divide a replica's batch of %d (--batch %d over --dp %d)",
			c.Batch/p.Replicas, c.Batch, p.Replicas)
	case c.Sync.Mode != "bsp":
		return nil, job.Invalid("Sync.Mode", c.Sync.Mode, `a pipeline job synchronises every step ("bsp"); hybrid sync with --pp is not supported`)
	case p.Balance != "params" && p.Balance != "time":
		return nil, job.Invalid("Pipeline.Balance", p.Balance, `want "params" or "time"`)
	case c.ClipNorm < 0:
		return nil, job.Invalid("ClipNorm", c.ClipNorm, "must not be negative")
	case c.OpTimeout <= 0:
		return nil, job.Invalid("OpTimeout", c.OpTimeout, "must be positive")
	case c.BucketBytes < 1:
		return nil, job.Invalid("BucketBytes", c.BucketBytes, "want a positive size")
	}
	if kind == schedule.Interleaved && p.Stages < 2 {
		// Its chunks pass activations from stage to stage; one stage
		// would have to pass them to itself.
		return nil, job.Invalid("Pipeline", p.Stages, "the interleaved schedule needs at least 2 stages (--pp)")
	}
	sc := schedule.Config{Kind: kind, Stages: p.Stages, Micro: c.MicroBatches, Chunks: p.Chunks}
	if err := sc.Validate(); err != nil {
		return nil, job.Invalid("Pipeline", sc, "%v", err)
	}
	if err := c.LRSchedule().Validate(); err != nil {
		return nil, job.Invalid("Schedule", c.Schedule.Kind, "%v", err)
	}
	layers, err := describe(m, o)
	if err != nil {
		return nil, &job.ConfigError{Field: "Model", Value: c.Model, Reason: err.Error(), Err: err}
	}
	parts := p.Stages * p.Chunks
	cl := cutLayers(layers, nil)
	if len(p.Cuts) == 0 {
		if p.Balance == "time" {
			return nil, job.Invalid("Pipeline.Cuts", p.Cuts, `balancing by time needs the launcher's measurement; give cuts or balance by "params"`)
		}
		cuts, err := cut.ByParams(cl, parts)
		if err != nil {
			return nil, job.Invalid("Pipeline.Stages", p.Stages, "%v", err)
		}
		p.Cuts = cuts
	} else if err := cut.Check(cl, p.Cuts, parts); err != nil {
		return nil, job.Invalid("Pipeline.Cuts", p.Cuts, "%v", err)
	}
	rb, per := c.Batch/p.Replicas, 1
	if m.SampleRows != nil {
		if per = m.SampleRows(o); per < 1 {
			return nil, job.Invalid("Model", c.Model, "%d rows a sample: want at least 1", per)
		}
	}
	return &shape{layers: layers, chunks: p.Chunks, ranges: cut.Cuts(p.Cuts).Ranges(len(layers)),
		replicaBatch: rb, rows: rb / c.MicroBatches, per: per}, nil
}

// configHash identifies what every worker of a job must share: the
// training configuration without what each process may set for itself.
func configHash(c *job.Config) string {
	s := *c
	s.Etcd, s.EtcdDialTimeout, s.LeaseTTL, s.Unreachable, s.Faults = nil, 0, 0, 0, job.FaultConfig{}
	b, _ := json.Marshal(s)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}
