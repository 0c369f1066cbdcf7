package elastic

import (
	"context"
	"sync"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// watch follows the job's generation record and done key.
type watch struct {
	mu      sync.Mutex
	gen     *phalanxpb.Generation
	done    bool
	err     error
	changed chan struct{} // closed at the next change
}

// state is the latest generation, whether the job is done, a channel closed
// at the next change, and a fatal error (a corrupt record).
func (w *watch) state() (*phalanxpb.Generation, bool, <-chan struct{}, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen, w.done, w.changed, w.err
}

func (w *watch) set(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
	close(w.changed)
	w.changed = make(chan struct{})
}

func startWatch(ctx context.Context, j *coordinator.Job, log *zap.Logger) *watch {
	w := &watch{changed: make(chan struct{})}
	go w.run(ctx, j, log)
	return w
}

// Follow watches a job's generations: f is called with each generation
// record as it is written (and with the current one first), until ctx ends.
// It is how a launcher or an operator tool follows a job.
func Follow(ctx context.Context, j *coordinator.Job, log *zap.Logger, f func(*phalanxpb.Generation)) error {
	w := startWatch(ctx, j, log)
	var last uint64
	for {
		g, done, changed, err := w.state()
		if err != nil {
			return err
		}
		if g != nil && g.Number > last {
			last = g.Number
			f(g)
		}
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *watch) run(ctx context.Context, j *coordinator.Job, log *zap.Logger) {
	err := j.WatchJob(ctx, log, func(g *phalanxpb.Generation, done bool) bool {
		w.set(func() {
			if g != nil && (w.gen == nil || g.Number > w.gen.Number) {
				w.gen = g
			}
			w.done = w.done || done
		})
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.set(func() { w.err = err })
	}
}
