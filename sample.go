package phalanx

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/job/logical"
)

// Sample generates from a checkpoint of a model that generates (gpt),
// whichever kind wrote it (a ring's checkpoint, or a tensor-parallel
// job's index of parts): it rebuilds the model the checkpoint records
// (its manifest's model and options) from the registry, loads every
// parameter as a logical tensor, each read checked, and continues the
// prompt.
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
	src, err := sampleSource(octx, store, sc.Name)
	if err != nil {
		return nil, err
	}
	id, m := src.ID, src.Manifest(0)
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
	read := func(name string, dst []float32) error {
		shape, ok := src.Shape(name)
		if !ok {
			return fmt.Errorf("phalanx sample: checkpoint %s has no tensor %q", id, name)
		}
		return src.Read(ctx, name, shape, dst)
	}
	return spec.Generate(o, m.Seed, read, sc.Generation)
}

// sampleSource is checkpoint name of store (an index's object name, or
// a ring checkpoint's ID, read unverified: each read checks itself), or
// the newest that verifies.
func sampleSource(ctx context.Context, store checkpoint.Store, name string) (*logical.Source, error) {
	switch {
	case strings.HasPrefix(name, logical.IndexPrefix):
		return logical.IndexSource(ctx, store, name)
	case name != "":
		m, err := checkpoint.ReadManifest(ctx, store, name)
		if err != nil {
			return nil, err
		}
		return logical.RingSource(store, m)
	}
	src, err := logical.Newest(ctx, store, "", nil, func(string, error) {})
	if err == nil && src == nil {
		err = fmt.Errorf("phalanx sample: %s: %w", store.Location(), checkpoint.ErrNoCheckpoint)
	}
	return src, err
}
