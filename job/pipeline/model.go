package pipeline

import (
	"fmt"

	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/pipeline/cut"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// Model is a pipeline model, the form an embedder gives its own staged
// model in (ModelSpec{Kind: "pipeline", Impl: &Model{...}}): an ordered
// list of layers that a pipeline cuts into stages, and its data. Layer i's
// weights must depend only on the seed and i, so that every process builds
// the same model and each keeps only its own stage's layers. The loss is
// softmax cross-entropy of the last layer's output against the labels.
type Model struct {
	// Layers describes the model's layers in order, without building
	// them.
	Layers func(o job.Options) ([]Layer, error)
	// Build makes layers [from, to), weights drawn from seed. Any
	// nn.Layer works; layers that are nn.Slotted (and nn.Splitter) keep
	// several micro-batches without recomputing (and split their backward
	// for zero-bubble schedules).
	Build func(o job.Options, seed uint64, from, to int) ([]nn.Layer, error)
	// Data is the training set and the held-out set, dense features as
	// wide as the first layer's input, with labels below the last layer's
	// output width.
	Data func(o job.Options, seed uint64) (train, test worker.Dataset, err error)
	// SampleRows, if set, is how many rows one sample fills in every
	// layer's input under options o (a sequence's tokens, each a row;
	// unset: one): Data's Fill then gives N·SampleRows rows of features and
	// a label for each row, and a micro-batch holds whole samples. A
	// sample's loss is its rows' mean, as a sequence model's is its
	// tokens'.
	SampleRows func(o job.Options) int
	// Measures, if set, adds the model's own measures of its held-out loss
	// and accuracy to the done event (a language model's perplexity).
	Measures func(loss, accuracy float64) map[string]float64
}

// Layer describes one layer of a Model.
type Layer struct {
	Name    string
	Params  int64 // parameter count
	In, Out int   // input and output widths
}

// describe reads and checks m's layers: names unique, widths chained.
func describe(m *Model, o job.Options) ([]Layer, error) {
	if m == nil || m.Layers == nil || m.Build == nil || m.Data == nil {
		return nil, fmt.Errorf("pipeline: a pipeline model needs Layers, Build and Data")
	}
	ls, err := m.Layers(o)
	if err != nil {
		return nil, err
	}
	if len(ls) == 0 {
		return nil, fmt.Errorf("pipeline: the model has no layers")
	}
	seen := map[string]int{}
	for i, l := range ls {
		switch {
		case l.Name == "":
			return nil, fmt.Errorf("pipeline: layer %d has no name", i)
		case l.In < 1 || l.Out < 1 || l.Params < 0:
			return nil, fmt.Errorf("pipeline: layer %d (%q): widths %d→%d and %d parameters", i, l.Name, l.In, l.Out, l.Params)
		case i > 0 && l.In != ls[i-1].Out:
			return nil, fmt.Errorf("pipeline: layer %d (%q) takes %d inputs, layer %d (%q) gives %d", i, l.Name, l.In, i-1, ls[i-1].Name, ls[i-1].Out)
		}
		if j, dup := seen[l.Name]; dup {
			return nil, fmt.Errorf("pipeline: layers %d and %d are both named %q", j, i, l.Name)
		}
		seen[l.Name] = i
	}
	return ls, nil
}

// cutLayers is ls as package cut sees them, costs from cost (nil: none).
func cutLayers(ls []Layer, cost []float64) []cut.Layer {
	out := make([]cut.Layer, len(ls))
	for i, l := range ls {
		out[i] = cut.Layer{Name: l.Name, Params: l.Params}
		if cost != nil {
			out[i].Cost = cost[i]
		}
	}
	return out
}

// ParseCuts reads a --pp-cuts value for pipeline model name of reg with
// options opts: layer indices or layer names, comma-separated.
func ParseCuts(s, name string, opts map[string]string, reg *job.Registry) ([]int, error) {
	spec, err := reg.Lookup(name)
	if err != nil {
		return nil, err
	}
	m, ok := spec.Impl.(*Model)
	if !ok {
		return nil, fmt.Errorf("model %s is not a pipeline model", name)
	}
	o, err := spec.Resolve(opts)
	if err != nil {
		return nil, err
	}
	ls, err := describe(m, o)
	if err != nil {
		return nil, err
	}
	c, err := cut.Parse(s, cutLayers(ls, nil))
	return c, err
}
