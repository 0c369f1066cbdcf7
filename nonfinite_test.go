package phalanx_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/worker"
)

// failures records a job's worker_failed events and whether it said done.
type failures struct {
	mu     sync.Mutex
	failed map[int]*worker.NonFiniteError // by worker
	done   bool
}

func (f *failures) Emit(event string, fields ...events.Field) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch event {
	case "done":
		f.done = true
	case "worker_failed":
		var w int
		var nf *worker.NonFiniteError
		for _, fl := range fields {
			switch fl.Key {
			case "worker":
				w = fl.Value.(int)
			case "non_finite":
				nf = fl.Value.(*worker.NonFiniteError)
			}
		}
		if f.failed == nil {
			f.failed = map[int]*worker.NonFiniteError{}
		}
		f.failed[w] = nf
	}
	return nil
}

// TestNonFiniteStepFailsEveryRank: a step whose loss and gradient are NaN
// on every rank fails that step on every rank, with a typed error naming
// the step and the parameter (the loss is NaN too), and the launch's error
// is that error, with no result and no "done". Run again and again: the
// first rank to find the fault must not tear the ring down before the
// others have found it too, or they see a broken ring and train on.
func TestNonFiniteStepFailsEveryRank(t *testing.T) {
	runs := 20
	if testing.Short() {
		runs = 3
	}
	const at = 7
	for i := range runs {
		t.Run(fmt.Sprint("run", i), func(t *testing.T) {
			lc := smallJob()
			lc.ModelOptions = phalanx.Options{"nan_at": fmt.Sprint(at)}
			f := &failures{}
			lc.Events = f
			res, err := phalanx.Launch(launchContext(t), lc)
			var nf *worker.NonFiniteError
			if !errors.As(err, &nf) || res != nil {
				t.Fatalf("Launch: %+v, %v; want no result and a *worker.NonFiniteError", res, err)
			}
			if want := (worker.NonFiniteError{Step: at, Param: "w", Index: 1}); *nf != want {
				t.Fatalf("the error says %+v, want %+v", *nf, want)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.done {
				t.Fatal("the job failed and its events say done")
			}
			for w := range lc.Workers {
				if got := f.failed[w]; got == nil || *got != *nf {
					t.Fatalf("worker %d's failure: %+v (all: %v); want every worker to fail step %d on its own", w, got, f.failed, at)
				}
			}
		})
	}
}
