package sparselr

import (
	"context"
	"fmt"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// ModelSpec is sparse logistic regression on the synthetic click log as a
// registered parameter-server model, "sparse-lr". Options: ids (feature
// ids), examples (training examples), held-out, epochs, features (ids per
// example), zipf (the ids' Zipf exponent) and sigma (the teacher's weight
// spread). Its held-out measures are auc, logloss and bayes_auc (the
// teacher's own AUC: the best any model can reach).
func ModelSpec() phalanx.ModelSpec {
	return phalanx.ModelSpec{
		Name:    "sparse-lr",
		Summary: "logistic regression on a synthetic click log, over parameter servers",
		Options: []phalanx.Option{
			{Name: "ids", Default: "1000000", Usage: "feature ids"},
			{Name: "examples", Default: "500000", Usage: "training examples of the synthetic click log"},
			{Name: "held-out", Default: "50000", Usage: "held-out examples (AUC and log-loss)"},
			{Name: "epochs", Default: "2", Usage: "passes over the training examples"},
			{Name: "features", Default: "16", Usage: "feature ids per example"},
			{Name: "zipf", Default: "1.2", Usage: "the Zipf exponent of the feature ids"},
			{Name: "sigma", Default: "0.45", Usage: "the spread of the teacher's weights (0.45: a best AUC of about 0.82)"},
		},
		Check: func(o phalanx.Options) error { _, err := parse(o); return err },
		PS:    &phalanx.PSModel{Tables: tables, Steps: steps, Run: run},
	}
}

// settings are the options, read.
type settings struct {
	gen                      Config
	examples, heldOut, epoch int
}

func parse(o phalanx.Options) (settings, error) {
	var s settings
	var err error
	ints := []struct {
		name string
		v    *int
	}{{"ids", &s.gen.IDs}, {"examples", &s.examples}, {"held-out", &s.heldOut}, {"epochs", &s.epoch}, {"features", &s.gen.Features}}
	for _, f := range ints {
		if *f.v, err = o.Int(f.name); err != nil {
			return s, err
		}
	}
	if s.gen.Zipf, err = o.Float("zipf"); err != nil {
		return s, err
	}
	if s.gen.Sigma, err = o.Float("sigma"); err != nil {
		return s, err
	}
	switch {
	case s.gen.IDs < 2 || s.examples < 1 || s.heldOut < 2 || s.epoch < 1 || s.gen.Features < 1 || s.gen.Features > 1024:
		return s, fmt.Errorf("options ids, examples, held-out, epochs and features must be positive (ids and held-out at least 2, features at most 1024)")
	}
	if _, err := NewGenerator(s.gen); err != nil {
		return s, err
	}
	return s, nil
}

func tables(o phalanx.Options, optimizer string, lr float32) ([]*phalanxpb.PSTable, error) {
	s, err := parse(o)
	if err != nil {
		return nil, err
	}
	return []*phalanxpb.PSTable{{Id: Table, Name: "sparse-lr", Dim: 1, KeySpace: uint64(s.gen.IDs) + 1, Init: "zeros",
		Optimizer: optimizer, Lr: lr}}, nil
}

// steps: each worker takes its share of every epoch in batches; the same
// number on every worker, which bsp needs.
func steps(o phalanx.Options, workers, batch int) (int64, error) {
	s, err := parse(o)
	if err != nil {
		return 0, err
	}
	perEpoch := (s.examples / workers) / batch
	if perEpoch < 1 {
		return 0, fmt.Errorf("option examples %d: each of %d workers' share is smaller than its batch of %d", s.examples, workers, batch)
	}
	return int64(perEpoch) * int64(s.epoch), nil
}

// run is one worker's loop: its share of the log, batch by batch, epoch
// after epoch; worker 0 then scores the held-out log.
func run(ctx context.Context, w *phalanx.PSWorker) (map[string]float64, error) {
	s, err := parse(w.Options)
	if err != nil {
		return nil, err
	}
	s.gen.Seed = w.Seed
	gen, err := NewGenerator(s.gen)
	if err != nil {
		return nil, err
	}
	train := gen.Draw(s.examples, 0)
	lo := w.Index * train.Len() / w.Workers
	perEpoch := (train.Len() / w.Workers) / w.Batch
	model := NewModel(w.Client, s.gen.IDs)
	idx := make([]int, w.Batch)
	for step := w.From; step < w.Steps; step++ {
		epoch, k := int(step)/perEpoch, int(step)%perEpoch
		for i := range idx {
			idx[i] = lo + k*w.Batch + i
		}
		loss, stale, err := model.Step(ctx, train, idx)
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", step+1, err)
		}
		if err := w.Step(ctx, step+1, epoch, loss, stale); err != nil {
			return nil, err
		}
	}
	if w.Index != 0 {
		return nil, nil
	}
	test := gen.Draw(s.heldOut, 1)
	p := make([]float32, test.Len())
	if err := model.Predict(ctx, test, 0, test.Len(), p); err != nil {
		return nil, fmt.Errorf("scoring the held-out log: %w", err)
	}
	return map[string]float64{"auc": AUC(p, test.Clicked), "logloss": LogLoss(p, test.Clicked), "bayes_auc": BayesAUC(test)}, nil
}
