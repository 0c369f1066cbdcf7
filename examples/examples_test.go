package examples

import (
	"testing"

	"github.com/phalanx-rt/phalanx"
)

// TestKindOfForms: each built-in model goes to the kind its job's
// configuration asks for: gpt, which has a ring form, a split one and a
// staged one, to the ring alone, to the pipeline kind with --pp or --tp;
// deep-mlp, staged only, to the pipeline kind always; mlp to the ring;
// and a model no kind names is owned by exactly one.
func TestKindOfForms(t *testing.T) {
	reg := Registry()
	for _, tc := range []struct {
		model          string
		stages, tensor int
		want           string
	}{
		{"gpt", 1, 0, "ring"},
		{"gpt", 2, 0, "pipeline"},
		{"gpt", 1, 2, "pipeline"},
		{"gpt", 2, 2, "pipeline"}, // refused there: a 3-D mesh
		{"deep-mlp", 1, 0, "pipeline"},
		{"deep-mlp", 4, 0, "pipeline"},
		{"mlp", 1, 0, "ring"},
		{"sparse-lr", 1, 0, "ps"},
	} {
		spec, err := reg.Lookup(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		cfg := phalanx.DefaultConfig()
		cfg.Pipeline.Stages, cfg.Pipeline.Tensor = tc.stages, tc.tensor
		k, err := reg.KindOf(spec, &cfg)
		if err != nil || k.Name() != tc.want {
			t.Errorf("%s with %d stages and %d tensor-parallel ranks: kind %v (%v), want %s", tc.model, tc.stages, tc.tensor, k, err, tc.want)
		}
		if spec.Kind != "" {
			continue // named, not owned
		}
		var owners []string // exactly one, whatever the kinds' order
		for _, k := range reg.Kinds() {
			if k.Owns(spec, &cfg) {
				owners = append(owners, k.Name())
			}
		}
		if len(owners) != 1 {
			t.Errorf("%s with %d stages and %d tensor-parallel ranks is owned by %v, want one kind", tc.model, tc.stages, tc.tensor, owners)
		}
	}
}
