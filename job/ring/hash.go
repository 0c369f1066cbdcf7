package ring

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/pki"
)

// jobHash identifies what every worker of a job must share: the training
// configuration without what each process may set for itself (etcd
// endpoints and how long to wait for them, membership timing, injected
// faults, its TLS files).
func jobHash(c *job.Config) string {
	s := *c
	s.Etcd, s.EtcdDialTimeout, s.LeaseTTL, s.Unreachable, s.Faults, s.TLS = nil, 0, 0, 0, job.FaultConfig{}, pki.Files{}
	return hashOf(s)
}

// checkpointHashes are what a checkpoint records. The config hash covers
// what shapes the training trajectory (batch, accumulation, optimizer,
// clipping, synchronisation): a resume under another is warned about. It
// leaves out the steps and the learning-rate schedule, so that training
// longer or on another schedule is no mismatch. The state hash covers
// what gives the saved tensors their meaning (the model and its options,
// the optimizer's kind, the seed, every tensor's name and shape): a resume
// under another is refused.
func checkpointHashes(c *job.Config, params []*nn.Param, slots []nn.Tensor) (config, state string) {
	config = hashOf(struct {
		Batch, MicroBatches, LocalSteps int
		ClipNorm                        float64
		Optimizer                       nn.OptimizerConfig
		Rescale                         string
		ReferenceWorld                  int
		Sync                            job.SyncConfig
		WireDType                       string `json:",omitempty"`
		ErrorFeedback                   bool   `json:",omitempty"`
	}{c.Batch, c.MicroBatches, c.LocalSteps, c.ClipNorm, c.Optimizer, string(c.Rescale), c.ReferenceWorld, c.Sync, wire(string(c.WireDType)), c.ErrorFeedback})
	var layout []string
	for _, p := range params {
		layout = append(layout, fmt.Sprintf("%s%v", p.Name, p.Shape))
	}
	for _, s := range slots {
		layout = append(layout, fmt.Sprintf("%s%v", s.Name, s.Shape))
	}
	state = hashOf(struct {
		Model    string
		Options  map[string]string
		Kind     string
		Nesterov bool
		Seed     uint64
		Layout   []string
	}{c.Model, options(c.ModelOptions), c.Optimizer.Kind, c.Optimizer.Nesterov, c.Seed, layout})
	return config, state
}

// options are model options as the checkpoint hash sees them: none, given
// as nil or as an empty map, hash alike (as nil did before DefaultConfig's
// map was made empty, not nil).
func options(o map[string]string) map[string]string {
	if len(o) == 0 {
		return nil
	}
	return o
}

// wire is the wire dtype as the checkpoint hash sees it: float32 (the
// default, and what older checkpoints were trained with) hashes as absent.
func wire(d string) string {
	if d == "float32" {
		return ""
	}
	return d
}

// hashOf is a short hash of v's JSON (struct fields in order, map keys
// sorted).
func hashOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("phalanx: hashing %T: %v", v, err)) // only plain data is hashed
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}
