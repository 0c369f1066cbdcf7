package mlp

import (
	"fmt"

	"github.com/phalanx-rt/phalanx"
)

// Spec is the MLP as a registered model, "mlp": options hidden (the hidden
// layers' widths), samples (the synthetic task's training samples; 10,000
// more are held out) and data (a directory of MNIST or Fashion-MNIST IDX
// files, plain or gzipped, instead of the synthetic task).
func Spec() phalanx.ModelSpec {
	return phalanx.ModelSpec{
		Name:    "mlp",
		Summary: "a multi-layer perceptron classifier, data-parallel over a ring",
		Options: []phalanx.Option{
			{Name: "hidden", Default: "512,512", Usage: "comma-separated hidden layer widths"},
			{Name: "samples", Default: "60000", Usage: "synthetic training samples (a further 10000 are held out)"},
			{Name: "data", Default: "", Usage: "directory with MNIST's (or Fashion-MNIST's) IDX files, plain or .gz, instead of the synthetic task"},
		},
		Check: check,
		New:   build,
	}
}

// options reads and checks the options.
func options(o phalanx.Options) (hidden []int, samples int, err error) {
	if hidden, err = o.Ints("hidden"); err != nil {
		return nil, 0, err
	}
	for _, w := range hidden {
		if w < 1 {
			return nil, 0, fmt.Errorf("option hidden %q: widths must be positive", o.String("hidden"))
		}
	}
	if samples, err = o.Int("samples"); err != nil {
		return nil, 0, err
	}
	if samples < 1 {
		return nil, 0, fmt.Errorf("option samples %d: want at least 1", samples)
	}
	return hidden, samples, nil
}

func check(o phalanx.Options) error {
	if _, _, err := options(o); err != nil {
		return err
	}
	if dir := o.String("data"); dir != "" {
		return CheckMNIST(dir)
	}
	return nil
}

func build(o phalanx.Options, seed uint64) (phalanx.Task, error) {
	hidden, samples, err := options(o)
	if err != nil {
		return phalanx.Task{}, err
	}
	var train, test *Data
	if dir := o.String("data"); dir != "" {
		train, test, err = LoadMNIST(dir)
	} else if train, err = Synthetic(samples, 784, 10, seed, 1); err == nil {
		test, err = Synthetic(10000, 784, 10, seed, 2)
	}
	if err != nil {
		return phalanx.Task{}, err
	}
	m, err := New(append(append([]int{train.Features}, hidden...), train.Classes), seed)
	if err != nil {
		return phalanx.Task{}, err
	}
	return phalanx.Task{Model: m, Train: train, Test: test}, nil
}
