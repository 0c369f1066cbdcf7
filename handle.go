package phalanx

import (
	"context"
	"errors"
	"sync"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/ring"
)

// Job is a running local job, started by Start: a Go service's handle on
// it, as etcd's embed.Etcd is on a server.
type Job struct {
	run
}

// Start starts a local job (see Launch) and returns at once: Ready closes
// once the first ring trains (its first step is reported), Wait returns
// how it ended, Stop stops it. A launch refused before anything starts
// (a bad configuration) is Start's error. Cancelling ctx ends the job as
// Stop does, without waiting.
func Start(ctx context.Context, lc LaunchConfig) (*Job, error) {
	j := &Job{run: newRun(ctx)}
	lc.Events = &readySink{next: lc.Events, ready: j.markReady}
	p, err := job.Prepare(j.ctx, lc)
	if err != nil {
		j.cancel(err)
		return nil, err
	}
	go func() { j.finish(p.Run(j.ctx)) }()
	return j, nil
}

// readySink passes events on, and says when the first step is reported.
type readySink struct {
	next  events.Sink
	ready func()
}

func (s *readySink) Emit(event string, fields ...events.Field) error {
	if event == "step" {
		s.ready()
	}
	if s.next == nil {
		return nil
	}
	return s.next.Emit(event, fields...)
}

// Worker is a running worker, started by StartWorker.
type Worker struct {
	run
}

// StartWorker starts one elastic worker (see RunWorker) and returns at
// once: Ready closes once it trains in a ring, Wait returns how it ended,
// Stop makes it leave the job gracefully (the others go on; Wait then
// says ErrLeft).
func StartWorker(ctx context.Context, cfg Config, task Task) (*Worker, error) {
	w := &Worker{run: newRun(ctx)}
	reports := cfg.Reports
	cfg.Reports = func(r Report) {
		if _, ok := r.(Training); ok {
			w.markReady()
		}
		if reports != nil {
			reports(r)
		}
	}
	if err := ring.CheckWorker(cfg, task); err != nil {
		w.cancel(err)
		return nil, err
	}
	go func() { w.finish(RunWorker(w.ctx, cfg, task)) }()
	return w, nil
}

// run is what a Job and a Worker share: a run in its own context, its
// readiness and its end.
type run struct {
	ctx       context.Context
	cancel    context.CancelCauseFunc
	ready     chan struct{}
	readyOnce sync.Once
	done      chan struct{}
	res       *Result
	err       error
}

// ErrStopRequested is the cause Stop gives the run's context.
var ErrStopRequested = errors.New("phalanx: stop requested")

func newRun(ctx context.Context) run {
	c, cancel := context.WithCancelCause(ctx)
	return run{ctx: c, cancel: cancel, ready: make(chan struct{}), done: make(chan struct{})}
}

func (r *run) markReady() { r.readyOnce.Do(func() { close(r.ready) }) }

func (r *run) finish(res *Result, err error) {
	r.res, r.err = res, err
	r.cancel(nil)
	close(r.done)
}

// Ready closes once the run trains; never, if it ends first (see Done).
func (r *run) Ready() <-chan struct{} { return r.ready }

// Done closes when the run has ended: Wait then returns at once.
func (r *run) Done() <-chan struct{} { return r.done }

// Wait waits for the run's end and returns its result: the result and the
// error never contradict each other (a result only with a nil error).
func (r *run) Wait() (*Result, error) {
	<-r.done
	return r.res, r.err
}

// Stop asks the run to stop and waits for its end or ctx's. A job with
// checkpoints stops at the next step boundary after a final one (Wait
// then says *StoppedError), one without at once; a worker leaves the job
// gracefully. Stop's error is ctx's, if it ended first; the run's own end
// is Wait's.
func (r *run) Stop(ctx context.Context) error {
	r.cancel(ErrStopRequested)
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
