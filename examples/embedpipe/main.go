// Command embedpipe is a Go program that embeds the Phalanx runtime for a
// pipeline of its own: a model cut into stages, written with two layers of
// its own (a tanh activation and a learned per-feature gain, plain
// nn.Layers) between nn's Dense layers, on a dataset of its own (points on
// concentric rings). It registers the model as a pipeline model
// (ModelSpec{Kind: "pipeline", Impl: &phalanx.PipelineModel{...}}) and
// trains it on --dp replicas of a --pp stage pipeline, each stage a
// re-execution of this binary that phalanx.Main turns into a pipeline
// worker (which runs pipeline.RunWorker): an embedded etcd server, the
// coordinator and the processes are the library's. It prints the held-out
// accuracy.
//
//	go run ./examples/embedpipe                      # 2 stages, 1 replica
//	go run ./examples/embedpipe --pp 3 --dp 2        # 2 replicas of 3 stages: 6 processes
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/nn"
)

// model registers the ring classifier: in (Dense), then depth blocks of
// fc<i> (Dense), tanh<i> and gain<i> (the program's own), then out
// (Dense). Layer i's weights come from the seed and i alone, so each
// stage process builds only its own layers.
func model() phalanx.ModelSpec {
	return phalanx.ModelSpec{
		Name:    "rings",
		Kind:    "pipeline",
		Summary: "a tanh tower with learned gains on concentric rings, pipelined",
		Options: []phalanx.Option{
			{Name: "depth", Default: "4", Usage: "fc+tanh+gain blocks"},
			{Name: "width", Default: "64", Usage: "the blocks' width"},
			{Name: "features", Default: "8", Usage: "input features (two carry the ring)"},
			{Name: "classes", Default: "4", Usage: "rings"},
			{Name: "samples", Default: "8192", Usage: "training points (2048 more are held out)"},
		},
		Impl: &phalanx.PipelineModel{Layers: layers, Build: build, Data: data},
	}
}

type shape struct{ depth, width, features, classes, samples int }

func options(o phalanx.Options) (shape, error) {
	var s shape
	for _, f := range []struct {
		name string
		to   *int
		min  int
	}{{"depth", &s.depth, 1}, {"width", &s.width, 1}, {"features", &s.features, 2}, {"classes", &s.classes, 2}, {"samples", &s.samples, 1}} {
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

func layers(o phalanx.Options) ([]phalanx.PipelineLayer, error) {
	s, err := options(o)
	if err != nil {
		return nil, err
	}
	w := s.width
	ls := []phalanx.PipelineLayer{{Name: "in", Params: int64(s.features*w + w), In: s.features, Out: w}}
	for i := range s.depth {
		ls = append(ls, phalanx.PipelineLayer{Name: fmt.Sprintf("fc%d", i), Params: int64(w*w + w), In: w, Out: w},
			phalanx.PipelineLayer{Name: fmt.Sprintf("tanh%d", i), In: w, Out: w},
			phalanx.PipelineLayer{Name: fmt.Sprintf("gain%d", i), Params: int64(w), In: w, Out: w})
	}
	return append(ls, phalanx.PipelineLayer{Name: "out", Params: int64(w*s.classes + s.classes), In: w, Out: s.classes}), nil
}

func build(o phalanx.Options, seed uint64, from, to int) ([]nn.Layer, error) {
	ls, err := layers(o)
	if err != nil {
		return nil, err
	}
	if from < 0 || to > len(ls) || from >= to {
		return nil, fmt.Errorf("rings: layers %d..%d of %d", from, to-1, len(ls))
	}
	var out []nn.Layer
	for i := from; i < to; i++ {
		l := ls[i]
		switch l.Name[:2] {
		case "ta":
			out = append(out, &tanh{})
		case "ga":
			out = append(out, newGain(l.Name, l.In))
		default:
			out = append(out, nn.NewDense(l.Name, l.In, l.Out, rand.New(rand.NewPCG(seed, uint64(i)+1))))
		}
	}
	return out, nil
}

func data(o phalanx.Options, seed uint64) (train, test phalanx.Dataset, err error) {
	s, err := options(o)
	if err != nil {
		return nil, nil, err
	}
	return newRings(s.samples, s.features, s.classes, seed, 1), newRings(2048, s.features, s.classes, seed, 2), nil
}

func main() {
	reg := phalanx.NewRegistry(model())
	phalanx.Main(reg) // in a worker process its launcher started: runs it and exits
	os.Exit(run(reg, os.Args[1:]))
}

func run(reg *phalanx.Registry, args []string) int {
	fs := flag.NewFlagSet("embedpipe", flag.ContinueOnError)
	lc := phalanx.DefaultLaunchConfig()
	lc.Registry, lc.Model = reg, "rings"
	lc.Steps, lc.Batch, lc.MicroBatches = 300, 64, 4
	lc.Optimizer.Kind, lc.Schedule.Base = "adam", 0.01
	lc.Output, lc.Stderr = os.Stdout, os.Stderr
	fs.IntVar(&lc.Pipeline.Stages, "pp", 2, "stages: processes per replica")
	fs.IntVar(&lc.Pipeline.Replicas, "dp", 1, "replicas of the pipeline")
	fs.StringVar(&lc.Pipeline.Schedule, "pp-schedule", "1f1b", "gpipe, 1f1b, interleaved or zb-h1")
	fs.IntVar(&lc.MicroBatches, "micro-batches", lc.MicroBatches, "micro-batches per replica per step")
	fs.Int64Var(&lc.Steps, "steps", lc.Steps, "the job's steps")
	fs.IntVar(&lc.Batch, "batch", lc.Batch, "the global batch")
	fs.StringVar(&lc.Checkpoint.Location, "checkpoint", "", "checkpoint directory or s3:// URL (none by default)")
	fs.Int64Var(&lc.Checkpoint.EverySteps, "checkpoint-every-steps", 0, "steps between checkpoints")
	fs.Uint64Var(&lc.Seed, "seed", lc.Seed, "seed of the points, the weights and the shuffle")
	fs.IntVar(&lc.Threads, "threads", 0, "GOMAXPROCS of each worker (0: the cores shared)")
	eventsPath := fs.String("events", "", "write the job's events as JSON lines to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	lc.Workers = lc.Pipeline.Stages * lc.Pipeline.Replicas
	lc.MinWorkers, lc.MaxWorkers = 1, lc.Workers
	if *eventsPath != "" {
		f, err := os.Create(*eventsPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "embedpipe:", err)
			return 1
		}
		defer f.Close()
		lc.Events = events.New(f, nil)
	}
	// SIGINT or SIGTERM stops the job (after a final checkpoint, when it
	// has a checkpoint location).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := phalanx.Launch(ctx, lc)
	var stopped *phalanx.StoppedError
	switch {
	case errors.As(err, &stopped):
		fmt.Println("embedpipe:", err)
		return 3
	case err != nil:
		fmt.Fprintln(os.Stderr, "embedpipe:", err)
		return 1
	}
	fmt.Printf("held-out accuracy %.2f%% (loss %.4f) after %d steps on %d processes; replicas identical: %v\n",
		100*res.Accuracy, res.Loss, res.Step, res.World, res.ParametersIdentical)
	return 0
}
