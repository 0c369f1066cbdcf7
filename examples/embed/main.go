// Command embed is a Go program that embeds the Phalanx runtime: it
// defines a model of its own (a small convolutional classifier of
// synthetic stroke images, written against the worker interfaces),
// registers it, and trains it elastically with checkpoints on a local job
// of its own processes: an embedded etcd server, a coordinator and
// --workers re-executions of this binary, which phalanx.Main turns into
// workers. It prints the held-out accuracy.
//
//	go run ./examples/embed                     # 3 workers, checkpoints in a temporary directory
//	go run ./examples/embed --checkpoint ckpt   # kept: a second run resumes (--steps more to train on)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
)

// model registers the classifier: every process of the job builds it from
// the same options and seed.
func model() phalanx.ModelSpec {
	return phalanx.ModelSpec{
		Name: "conv-shapes",
		Options: []phalanx.Option{
			{Name: "images", Default: "6000", Usage: "training images (a further 2000 are held out)"},
			{Name: "filters", Default: "8", Usage: "convolution channels"},
		},
		New: func(o phalanx.Options, seed uint64) (phalanx.Task, error) {
			n, err := o.Int("images")
			if err != nil {
				return phalanx.Task{}, err
			}
			filters, err := o.Int("filters")
			if err != nil {
				return phalanx.Task{}, err
			}
			train, err := newShapes(n, 12, 0.3, seed, 1)
			if err != nil {
				return phalanx.Task{}, err
			}
			test, err := newShapes(2000, 12, 0.3, seed, 2)
			if err != nil {
				return phalanx.Task{}, err
			}
			net, err := newConvNet(12, filters, 4, seed)
			return phalanx.Task{Model: net, Train: train, Test: test}, err
		},
	}
}

func main() {
	reg := phalanx.NewRegistry(model())
	phalanx.Main(reg) // in a worker process its launcher started: runs it and exits
	os.Exit(run(reg, os.Args[1:]))
}

func run(reg *phalanx.Registry, args []string) int {
	fs := flag.NewFlagSet("embed", flag.ContinueOnError)
	lc := phalanx.DefaultLaunchConfig()
	lc.Registry, lc.Model, lc.Workers = reg, "conv-shapes", 3
	lc.Steps, lc.Batch = 200, 96
	lc.Optimizer.Kind, lc.Schedule.Base = "adam", 0.1
	lc.Checkpoint.EverySteps = 25
	lc.Output, lc.Stderr = os.Stdout, os.Stderr
	fs.IntVar(&lc.Workers, "workers", lc.Workers, "worker processes")
	fs.Int64Var(&lc.Steps, "steps", lc.Steps, "the job's steps")
	fs.StringVar(&lc.Checkpoint.Location, "checkpoint", "", "checkpoint directory or s3:// URL (default: a temporary directory, removed at the end)")
	fs.Int64Var(&lc.Checkpoint.EverySteps, "checkpoint-every-steps", lc.Checkpoint.EverySteps, "steps between checkpoints")
	fs.Uint64Var(&lc.Seed, "seed", lc.Seed, "seed of the images, the weights and the shuffle")
	fs.Float64Var(&lc.Schedule.Base, "lr", lc.Schedule.Base, "Adam's base learning rate")
	fs.IntVar(&lc.MinWorkers, "min-workers", lc.MinWorkers, "fewest workers the job trains with")
	fs.DurationVar(&lc.JoinWindow, "join-window", lc.JoinWindow, "how long newcomers wait for each other")
	fs.DurationVar(&lc.LeaseTTL, "lease-ttl", lc.LeaseTTL, "a worker's registration lease")
	fs.IntVar(&lc.Threads, "threads", 0, "GOMAXPROCS of each worker (0: the cores shared)")
	eventsPath := fs.String("events", "", "write the job's events as JSON lines to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if lc.Checkpoint.Location == "" {
		dir, err := os.MkdirTemp("", "embed-checkpoints-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "embed:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		lc.Checkpoint.Location = dir
	}
	if *eventsPath != "" {
		f, err := os.Create(*eventsPath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "embed:", err)
			return 1
		}
		defer f.Close()
		lc.Events = events.New(f, nil)
	}
	// SIGINT or SIGTERM stops the job after a final checkpoint.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := phalanx.Launch(ctx, lc)
	var stopped *phalanx.StoppedError
	switch {
	case errors.As(err, &stopped):
		fmt.Println("embed:", err)
		return 3
	case err != nil:
		fmt.Fprintln(os.Stderr, "embed:", err)
		return 1
	}
	fmt.Printf("held-out accuracy %.2f%% (loss %.4f) after %d steps on %d workers; parameters identical on every rank: %v\n",
		100*res.Accuracy, res.Loss, res.Step, res.World, res.ParametersIdentical)
	return 0
}
