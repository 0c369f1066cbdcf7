package gpt

import (
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/tp"
)

// Spec is the GPT as a registered model, "gpt": options width, depth,
// heads and context (the model's shape), data (a text file instead of the
// Go source), goroot (where the Go source is; default: go env GOROOT),
// corpus-mb (how much of the Go source to read) and eval-windows (the
// held-out windows scored at the end).
func Spec() phalanx.ModelSpec {
	return phalanx.ModelSpec{
		Name:    "gpt",
		Summary: "a GPT-style character-level language model on the Go standard library's source (or --data FILE)",
		Options: []phalanx.Option{
			{Name: "width", Default: "256", Usage: "features per token (d)"},
			{Name: "depth", Default: "4", Usage: "transformer blocks"},
			{Name: "heads", Default: "4", Usage: "attention heads (they divide the width)"},
			{Name: "context", Default: "128", Usage: "characters per training window"},
			{Name: "data", Default: "", Usage: "a UTF-8 text file to train on instead of the Go source (its last tenth held out)"},
			{Name: "goroot", Default: "", Usage: "the Go tree whose src/ is the corpus; empty: go env GOROOT"},
			{Name: "corpus-mb", Default: "8", Usage: "MiB of the Go source to read (0: all of it)"},
			{Name: "eval-windows", Default: "256", Usage: "held-out windows scored at the end (0: all)"},
			{Name: "sequence-parallel", Default: "false", Usage: "split the LayerNorm regions' tokens across the tensor-parallel ranks (Megatron's sequence parallelism)"},
		},
		Check: func(o phalanx.Options) error {
			if _, _, err := options(o); err != nil {
				return err
			}
			if path := o.String("data"); path != "" {
				_, err := ReadText(path)
				return err
			}
			return nil
		},
		New:      build,
		Split:    buildSplit,
		Impl:     Staged(),
		Generate: generate,
	}
}

// generate is Generate on the whole model of options o, its parameters
// read by name.
func generate(o phalanx.Options, seed uint64, read func(name string, dst []float32) error, g phalanx.Generation) ([]byte, error) {
	m, err := whole(o, seed)
	if err != nil {
		return nil, err
	}
	if err := m.Load(read); err != nil {
		return nil, err
	}
	return m.Generate(g.Prompt, g.Tokens, g.Temperature, g.Seed)
}

// whole is the whole model of options o.
func whole(o phalanx.Options, seed uint64) (*Model, error) {
	cfg, _, err := options(o)
	if err != nil {
		return nil, err
	}
	return New(cfg, seed, nil)
}

type settings struct {
	corpusMB, evalWindows int
}

// options reads the model's shape and the data settings.
func options(o phalanx.Options) (Config, settings, error) {
	var c Config
	var s settings
	for _, f := range []struct {
		name string
		to   *int
		min  int
	}{{"width", &c.Width, 1}, {"depth", &c.Depth, 1}, {"heads", &c.Heads, 1}, {"context", &c.Context, 1},
		{"corpus-mb", &s.corpusMB, 0}, {"eval-windows", &s.evalWindows, 0}} {
		v, err := o.Int(f.name)
		if err != nil {
			return c, s, err
		}
		if v < f.min {
			return c, s, fmt.Errorf("option %s %d: want at least %d", f.name, v, f.min)
		}
		*f.to = v
	}
	sp, err := strconv.ParseBool(o.String("sequence-parallel"))
	if err != nil {
		return c, s, fmt.Errorf("option sequence-parallel %q: want true or false", o.String("sequence-parallel"))
	}
	c.SequenceParallel = sp
	return c, s, c.Check(1)
}

// Load is the corpus the options name.
func Load(ctx context.Context, o phalanx.Options) (*Corpus, error) {
	if path := o.String("data"); path != "" {
		return ReadText(path)
	}
	_, s, err := options(o)
	if err != nil {
		return nil, err
	}
	goroot := o.String("goroot")
	if goroot == "" {
		if goroot, err = GOROOT(ctx); err != nil {
			return nil, err
		}
	}
	return GoSource(goroot, int64(s.corpusMB)<<20)
}

// GOROOT is go env GOROOT, or where this binary's Go was when it was
// built if no go command is on the PATH.
func GOROOT(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", "GOROOT").Output()
	if root := strings.TrimSpace(string(out)); err == nil && root != "" {
		return root, nil
	}
	//lint:ignore SA1019 the fallback when no go command runs
	if root := runtime.GOROOT(); root != "" {
		return root, nil
	}
	return "", fmt.Errorf("gpt: no Go tree found (go env GOROOT: %v): give the option goroot or data", err)
}

func build(o phalanx.Options, seed uint64) (phalanx.Task, error) { return buildSplit(o, seed, nil) }

// buildSplit is the task of a tensor-parallel rank (comm nil: the whole
// model).
func buildSplit(o phalanx.Options, seed uint64, comm *tp.Comm) (phalanx.Task, error) {
	cfg, corpus, train, test, err := windows(o)
	if err != nil {
		return phalanx.Task{}, err
	}
	m, err := New(cfg, seed, comm)
	if err != nil {
		return phalanx.Task{}, err
	}
	base := Unigram(corpus.Train, test)
	measures := func(loss, acc float64) map[string]float64 {
		out := Measures(loss, acc)
		out["unigram_nats_per_char"] = base
		return out
	}
	return phalanx.Task{Model: m, Train: train, Test: test, Measures: measures}, nil
}

// windows are the training and held-out windows of the corpus the options
// name.
func windows(o phalanx.Options) (Config, *Corpus, *Windows, *Windows, error) {
	cfg, s, err := options(o)
	if err != nil {
		return cfg, nil, nil, nil, err
	}
	corpus, err := Load(context.Background(), o)
	if err != nil {
		return cfg, nil, nil, nil, err
	}
	train := &Windows{Text: corpus.Train, Context: cfg.Context}
	test := &Windows{Text: corpus.Heldout, Context: cfg.Context, Limit: s.evalWindows}
	if train.Len() == 0 || test.Len() == 0 {
		return cfg, nil, nil, nil, fmt.Errorf("gpt: %s gives %d training and %d held-out windows of %d characters: too little text",
			corpus.Source, train.Len(), test.Len(), cfg.Context+1)
	}
	return cfg, corpus, train, test, nil
}
