package job

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
	"github.com/phalanx-rt/phalanx/tp"
	"github.com/phalanx-rt/phalanx/worker"
)

// Task is what a ring worker trains: the user's model and data. Every
// worker builds its own from the same configuration; the ring starts from
// the parameters of one of them, so they need not be initialised alike.
type Task struct {
	Model worker.Model
	Train worker.Dataset
	// Test is held-out data, scored at the end when Model is also a
	// worker.Evaluator: the mean loss and the accuracy over every sample.
	Test worker.Dataset
	// Measures, when set, names further held-out measures computed from
	// the loss and accuracy over Test (a language model's perplexity); the
	// done event and Result.Metrics carry them.
	Measures func(loss, accuracy float64) map[string]float64
}

// ModelSpec is a model that jobs can train by name: the launcher, the
// command and every worker process build it from the same options. A ring
// model has New; a parameter-server model has PS; a model of another kind
// names it (Kind) and carries what that kind reads (Impl).
type ModelSpec struct {
	Name    string
	Summary string
	Options []Option
	// Check validates options cheaply (values in range, input files
	// present) before any process of a job starts. Optional.
	Check func(o Options) error
	// New builds a worker's task from the options and the job's seed.
	New func(o Options, seed uint64) (Task, error)
	// Split, when set, builds a ring model split across a tensor-parallel
	// group (--tp): each rank's part of the model (comm says which), and
	// the data. The model's parameters are slices of the whole model's;
	// it implements Sliced to say which.
	Split func(o Options, seed uint64, comm *tp.Comm) (Task, error)
	// PS is a parameter-server model's worker.
	PS *PSModel
	// Kind names the model's job kind when it is neither a ring model
	// (New) nor a parameter-server one (PS): a kind added to the Registry
	// (Registry.AddKind), which reads the model from Impl.
	Kind string
	Impl any
	// Generate, when set, continues prompt by n tokens from a trained
	// model's parameters, which read fills by name from a checkpoint
	// (phalanx sample): at temperature t, with the randomness of seed.
	Generate func(o Options, seed uint64, read func(name string, dst []float32) error, g Generation) ([]byte, error)
}

// Generation is what to generate: a prompt, how many tokens, at what
// temperature (0: the likeliest) and with what seed.
type Generation struct {
	Prompt      []byte
	Tokens      int
	Temperature float64
	Seed        uint64
}

// Option is one option of a model: its name, default and meaning.
type Option struct {
	Name, Default, Usage string
}

// PSModel is a parameter-server model: the tables its job's servers host,
// its length, and one worker's training loop.
type PSModel struct {
	// Tables are the job's tables for these options and the servers'
	// optimizer (PSConfig.Optimizer, PSConfig.LR).
	Tables func(o Options, optimizer string, lr float32) ([]*phalanxpb.PSTable, error)
	// Steps is how many steps each of workers workers takes with a batch
	// of batch examples per step.
	Steps func(o Options, workers, batch int) (int64, error)
	// Run trains worker w.Index from step w.From to w.Steps and returns
	// what it measured on held-out data (worker 0's is the job's result).
	Run func(ctx context.Context, w *PSWorker) (map[string]float64, error)
}

// PSWorker is what a parameter-server model's loop works with.
type PSWorker struct {
	Client         *ps.Client
	Options        Options
	Index, Workers int
	Batch          int // examples per step of this worker
	Seed           uint64
	From, Steps    int64 // the first step to take (after a restore) and the job's steps
	// Step must be called after every step (counted from 1) with its epoch
	// (from 0), its loss (mean over the batch) and the pushes it found
	// stale: it reports progress and takes the checkpoints that are due.
	Step func(ctx context.Context, step int64, epoch int, loss float64, stale int) error
}

// Options are a model's options by name, its defaults filled in.
type Options map[string]string

// String is option name's value.
func (o Options) String(name string) string { return o[name] }

// Int is option name's value as an integer.
func (o Options) Int(name string) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(o[name]))
	if err != nil {
		return 0, fmt.Errorf("option %s %q: want an integer", name, o[name])
	}
	return v, nil
}

// Float is option name's value as a number.
func (o Options) Float(name string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(o[name]), 64)
	if err != nil {
		return 0, fmt.Errorf("option %s %q: want a number", name, o[name])
	}
	return v, nil
}

// Ints is option name's value as a comma-separated list of integers.
func (o Options) Ints(name string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(o[name], ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("option %s %q: want comma-separated integers", name, o[name])
		}
		out = append(out, v)
	}
	return out, nil
}

// Registry resolves models by name. It is built once at start-up and read
// only afterwards; there is no global one.
type Registry struct {
	specs []ModelSpec
	kinds []Kind
}

// NewRegistry holds specs, of kinds. A spec without a name, with both or
// neither of New and PS (unless it names its Kind), or a name given twice
// is a programming error: it panics.
func NewRegistry(kinds []Kind, specs ...ModelSpec) *Registry {
	r := &Registry{}
	for _, k := range kinds {
		if err := r.AddKind(k); err != nil {
			panic(err.Error())
		}
	}
	for _, s := range specs {
		switch {
		case s.Name == "":
			panic("phalanx: a ModelSpec without a name")
		case s.Kind == "" && (s.New == nil) == (s.PS == nil):
			panic(fmt.Sprintf("phalanx: model %q: want exactly one of New and PS", s.Name))
		case slices.ContainsFunc(r.specs, func(o ModelSpec) bool { return o.Name == s.Name }):
			panic(fmt.Sprintf("phalanx: model %q registered twice", s.Name))
		}
		r.specs = append(r.specs, s)
	}
	return r
}

// Names are the models' names, in registration order.
func (r *Registry) Names() []string {
	var out []string
	for _, s := range r.specs {
		out = append(out, s.Name)
	}
	return out
}

// Specs are the models, in registration order.
func (r *Registry) Specs() []ModelSpec { return slices.Clone(r.specs) }

// Lookup finds model name.
func (r *Registry) Lookup(name string) (ModelSpec, error) {
	if r != nil {
		for _, s := range r.specs {
			if s.Name == name {
				return s, nil
			}
		}
	}
	return ModelSpec{}, Invalid("Model", name, "not a registered model; the models are: %s", strings.Join(r.Names(), ", "))
}

// Resolve is spec's options: its defaults overridden by given. An option
// the spec does not have is an error naming it.
func (s ModelSpec) Resolve(given map[string]string) (Options, error) {
	o := Options{}
	for _, opt := range s.Options {
		o[opt.Name] = opt.Default
	}
	for k, v := range given {
		if _, ok := o[k]; !ok {
			return nil, Invalid("ModelOptions", k, "model %s has no such option", s.Name)
		}
		o[k] = v
	}
	return o, nil
}

// Check resolves and checks cfg's model options against the registry.
func (r *Registry) Check(cfg *Config) (ModelSpec, Options, error) {
	spec, err := r.Lookup(cfg.Model)
	if err != nil {
		return spec, nil, err
	}
	o, err := spec.Resolve(cfg.ModelOptions)
	if err != nil {
		return spec, nil, err
	}
	if spec.Check != nil {
		if err := spec.Check(o); err != nil {
			return spec, nil, &ConfigError{Field: "ModelOptions", Value: o, Reason: fmt.Sprintf("model %s: %v", spec.Name, err), Err: err}
		}
	}
	return spec, o, nil
}
