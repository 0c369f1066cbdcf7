// Package deepmlp is the pipeline example, "deep-mlp": a deep multi-layer
// perceptron (depth hidden Dense+ReLU layers of one width, then a Dense
// classifier) on the synthetic teacher task of package mlp, as a pipeline
// model that a pipeline job cuts into stages. Each layer's weights are
// drawn from the seed and the layer's index alone, so every stage process
// builds its own layers and no other.
package deepmlp

import (
	"fmt"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples/mlp"
	"github.com/phalanx-rt/phalanx/nn"
)

// Spec is the deep MLP as a registered model of kind pipeline: options
// depth (hidden layers), width (their width), features (the inputs),
// classes and samples (the synthetic training samples; 4,096 more are
// held out).
func Spec() phalanx.ModelSpec {
	return phalanx.ModelSpec{
		Name:    "deep-mlp",
		Kind:    "pipeline",
		Summary: "a deep multi-layer perceptron, pipelined over stages (--pp) and replicas (--dp)",
		Options: []phalanx.Option{
			{Name: "depth", Default: "16", Usage: "hidden Dense+ReLU layers"},
			{Name: "width", Default: "1024", Usage: "the hidden layers' width"},
			{Name: "features", Default: "256", Usage: "input features of the synthetic task"},
			{Name: "classes", Default: "10", Usage: "classes of the synthetic task"},
			{Name: "samples", Default: "32768", Usage: "synthetic training samples (4096 more are held out)"},
		},
		Check: func(o phalanx.Options) error { _, err := options(o); return err },
		Impl:  Model(),
	}
}

// Model is the deep MLP's pipeline form.
func Model() *phalanx.PipelineModel {
	return &phalanx.PipelineModel{Layers: layers, Build: build, Data: data}
}

type shape struct{ depth, width, features, classes, samples int }

func options(o phalanx.Options) (shape, error) {
	var s shape
	for _, f := range []struct {
		name string
		to   *int
		min  int
	}{{"depth", &s.depth, 1}, {"width", &s.width, 1}, {"features", &s.features, 1}, {"classes", &s.classes, 2}, {"samples", &s.samples, 1}} {
		v, err := o.Int(f.name)
		if err != nil {
			return s, err
		}
		if v < f.min {
			return s, fmt.Errorf("option %s %d: want at least %d", f.name, v, f.min)
		}
		*f.to = v
	}
	return s, nil
}

// layers are fc0, relu0, ..., fc{depth-1}, relu{depth-1}, out.
func layers(o phalanx.Options) ([]phalanx.PipelineLayer, error) {
	s, err := options(o)
	if err != nil {
		return nil, err
	}
	var ls []phalanx.PipelineLayer
	in := s.features
	for d := range s.depth {
		ls = append(ls, phalanx.PipelineLayer{Name: fmt.Sprintf("fc%d", d), Params: int64(in*s.width + s.width), In: in, Out: s.width},
			phalanx.PipelineLayer{Name: fmt.Sprintf("relu%d", d), In: s.width, Out: s.width})
		in = s.width
	}
	return append(ls, phalanx.PipelineLayer{Name: "out", Params: int64(in*s.classes + s.classes), In: in, Out: s.classes}), nil
}

// build makes layers [from, to); a Dense layer's weights come from the
// seed and its index.
func build(o phalanx.Options, seed uint64, from, to int) ([]nn.Layer, error) {
	ls, err := layers(o)
	if err != nil {
		return nil, err
	}
	if from < 0 || to > len(ls) || from >= to {
		return nil, fmt.Errorf("deep-mlp: layers %d..%d of %d", from, to-1, len(ls))
	}
	var out []nn.Layer
	for i := from; i < to; i++ {
		l := ls[i]
		if l.Params == 0 {
			out = append(out, &nn.ReLU{})
			continue
		}
		out = append(out, nn.NewDense(l.Name, l.In, l.Out, rand.New(rand.NewPCG(seed, uint64(i)+1))))
	}
	return out, nil
}

func data(o phalanx.Options, seed uint64) (train, test phalanx.Dataset, err error) {
	s, err := options(o)
	if err != nil {
		return nil, nil, err
	}
	tr, err := mlp.Synthetic(s.samples, s.features, s.classes, seed, 1)
	if err != nil {
		return nil, nil, err
	}
	te, err := mlp.Synthetic(4096, s.features, s.classes, seed, 2)
	if err != nil {
		return nil, nil, err
	}
	return tr, te, nil
}
