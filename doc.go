// Package phalanx is the Phalanx runtime: elastic, fault-tolerant,
// checkpointed data-parallel training of a Go program's own model. When a
// worker falls, the others close ranks: the ring reshapes, state is
// restored from memory, training goes on.
//
// A program defines its model and data by implementing worker.Model and
// worker.Dataset (worker.Evaluator to be scored on held-out data),
// registers them in a Registry, and then either
//   - launches a local job with Launch: an embedded etcd server, a
//     coordinator and N worker processes that re-execute the program
//     itself, which Main, called first in main, turns into workers; or
//   - runs one worker of a job with RunWorker (or RunModel), joining
//     through the job's etcd: one per host, as an operator would.
//
// Config holds a job's settings (DefaultConfig is a good start): steps,
// batch, optimizer and schedule, BSP or hybrid synchronisation with
// straggler exclusion, checkpoints to a directory or S3 and resume into
// any world size, restart budgets, and the process's logger, clock and
// report sink. Validation names the bad field (ConfigError). Cancelling a
// worker's context makes it leave the job gracefully; Stop, or cancelling
// Launch's context, stops the whole job after a final checkpoint.
//
// A Go service that wants a handle rather than a blocking call uses Start
// (or StartWorker): Ready closes once the job trains, Wait returns how it
// ended, Stop stops it.
//
// Each kind of job is a package of its own under job/ (job/ring: the
// data-parallel ring; job/psjob: parameter servers), plugged into one
// launcher and one role dispatch (package job) through the job.Kind
// interface; NewRegistry knows the built-in kinds, Registry.AddKind adds
// others. The configuration types here are package job's.
//
// A complete program, its own model included, training on two worker
// processes of itself:
//
//	package main
//
//	import (
//		"context"
//		"fmt"
//		"log"
//
//		"github.com/phalanx-rt/phalanx"
//		"github.com/phalanx-rt/phalanx/nn"
//		"github.com/phalanx-rt/phalanx/worker"
//	)
//
//	type line struct{ p *nn.Param } // y = a·x + b, fitted to samples (x, y) of y = 3x + 1
//
//	func (m *line) Params() []*nn.Param                             { return []*nn.Param{m.p} }
//	func (m *line) Evaluate(b *worker.Batch) (worker.Result, error) { return m.Step(b, 0, nil) }
//	func (m *line) Step(b *worker.Batch, scale float32, _ func(int)) (r worker.Result, _ error) {
//		for i := range b.N {
//			e := m.p.Value[0]*b.X[2*i] + m.p.Value[1] - b.X[2*i+1]
//			r.LossSum += float64(e * e)
//			m.p.Grad[0] += scale * 2 * e * b.X[2*i]
//			m.p.Grad[1] += scale * 2 * e
//		}
//		return r, nil
//	}
//
//	type points int
//
//	func (n points) Len() int { return int(n) }
//	func (n points) Fill(idx []int, b *worker.Batch) error {
//		b.Reset(len(idx), 2)
//		for k, i := range idx {
//			b.X[2*k], b.X[2*k+1] = float32(i)/float32(n), 3*float32(i)/float32(n)+1
//		}
//		return nil
//	}
//
//	func main() {
//		reg := phalanx.NewRegistry(phalanx.ModelSpec{Name: "line", New: func(phalanx.Options, uint64) (phalanx.Task, error) {
//			return phalanx.Task{Model: &line{nn.NewParam("line", 2)}, Train: points(1000), Test: points(100)}, nil
//		}})
//		phalanx.Main(reg) // in a worker process: trains, then exits
//		lc := phalanx.DefaultLaunchConfig()
//		lc.Registry, lc.Model, lc.Workers, lc.Steps, lc.Batch = reg, "line", 2, 200, 50
//		res, err := phalanx.Launch(context.Background(), lc)
//		if err != nil {
//			log.Fatal(err)
//		}
//		fmt.Printf("held-out loss %.5f on %d workers; identical: %v\n", res.Loss, res.World, res.ParametersIdentical)
//	}
//
// The phalanx command is a shell over this package; examples/embed is a
// longer program (a convolutional classifier with checkpoints).
package phalanx
