package ring

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/phalanx-rt/phalanx/failure"
	"github.com/phalanx-rt/phalanx/worker"
)

// faultyModel panics once in model code at a chosen step (FaultConfig's
// FailWorker/FailStep), to watch a rank actor's restart.
type faultyModel struct {
	worker.Model
	trainer *worker.Trainer
	at      int64
	times   int // failures left
}

func (f *faultyModel) Step(b *worker.Batch, scale float32, ready func(int)) (worker.Result, error) {
	if f.trainer.NextStep() == f.at && f.times > 0 {
		f.times--
		panic(fmt.Sprintf("fault injected at step %d", f.at))
	}
	return f.Model.Step(b, scale, ready)
}

// injectedModel slows down or pauses the model code of a ring rank
// (FaultConfig.Inject): stragglers for tests and benchmarks. Sleeping is
// the fault here, not a synchronisation.
type injectedModel struct {
	worker.Model
	in      failure.Injection
	trainer *worker.Trainer
	paused  int64 // the step already paused at
	wrong   int64 // the step the wrong operation was called at
	// probeStep, when not 0, is the ring's step while this worker is
	// excluded and times its own steps: the injection follows the ring.
	probeStep *atomic.Int64
}

func (m *injectedModel) Step(b *worker.Batch, scale float32, ready func(int)) (worker.Result, error) {
	rank, step := m.trainer.Group().Rank(), m.trainer.NextStep()
	if s := m.probeStep.Load(); s > 0 {
		step = s
	}
	if d := m.in.PauseAt(rank, step); d > 0 && m.paused != step {
		m.paused = step
		time.Sleep(d)
	}
	if m.in.WrongOpAt(rank, step) && m.wrong != step {
		// The fault: a barrier the others do not call, where they enter
		// the step's first allreduce. Its failure is the point.
		m.wrong = step
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		m.trainer.Group().Barrier(ctx)
		cancel()
	}
	start := time.Now()
	res, err := m.Model.Step(b, scale, ready)
	if f := m.in.Factor(rank, step); f > 1 {
		time.Sleep(time.Duration(float64(time.Since(start)) * (f - 1)))
	}
	return res, err
}
