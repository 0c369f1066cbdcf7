package job

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
)

// SampleConfig is a generation from a checkpoint: the store (a directory
// or an s3:// URL) and its credentials, the checkpoint's name (empty: the
// newest complete one), and what to generate.
type SampleConfig struct {
	Checkpoint  string
	Name        string
	Credentials checkpoint.Credentials
	Generation
}

// Sample rebuilds the model a checkpoint was written by, from the model
// and options its manifest records and the registry, loads its
// parameters (each tensor checked against its checksums) and generates
// from it. The model must be one that generates (ModelSpec.Generate).
func Sample(ctx context.Context, sc SampleConfig, reg *Registry) ([]byte, error) {
	if sc.Tokens < 0 {
		return nil, fmt.Errorf("phalanx sample: %d tokens to generate", sc.Tokens)
	}
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	store, err := checkpoint.OpenExisting(octx, sc.Checkpoint, sc.Credentials)
	if err != nil {
		return nil, err
	}
	id := sc.Name
	if id == "" {
		infos, err := checkpoint.List(octx, store)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(infos, func(in checkpoint.Info) bool { return in.Complete })
		if i < 0 {
			return nil, fmt.Errorf("phalanx sample: %s: %w", store.Location(), checkpoint.ErrNoCheckpoint)
		}
		id = infos[i].ID
	}
	m, err := checkpoint.ReadManifest(octx, store, id)
	if err != nil {
		return nil, err
	}
	if m.Model == "" {
		return nil, fmt.Errorf("phalanx sample: checkpoint %s records no model (written by an older Phalanx, or by an embedding program)", id)
	}
	spec, err := reg.Lookup(m.Model)
	if err != nil {
		return nil, fmt.Errorf("phalanx sample: checkpoint %s: %w", id, err)
	}
	if spec.Generate == nil {
		return nil, fmt.Errorf("phalanx sample: checkpoint %s is of model %s, which does not generate", id, m.Model)
	}
	o, err := spec.Resolve(m.ModelOptions)
	if err != nil {
		return nil, fmt.Errorf("phalanx sample: checkpoint %s: %w", id, err)
	}
	read := func(name string, dst []float32) error { return checkpoint.ReadTensor(ctx, store, m, name, dst) }
	return spec.Generate(o, m.Seed, read, sc.Generation)
}
