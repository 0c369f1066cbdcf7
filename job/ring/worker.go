package ring

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/internal/netaddr"
	"github.com/phalanx-rt/phalanx/internal/plant"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/metrics"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

// RunWorker runs one elastic worker of job cfg.Job, training task: it
// registers in the job's etcd (cfg.Etcd), trains in every generation the
// coordinator puts it in (BSP or hybrid steps, straggler exclusion and
// readmission, checkpoints and resume), and survives the loss or arrival
// of others. It returns when the job is done. Cancelling ctx makes the
// worker leave the job gracefully (ErrLeft): the ring shrinks and the
// others go on. A stop of the whole job (Stop) is a *StoppedError.
func RunWorker(ctx context.Context, cfg job.Config, task job.Task) (*job.Result, error) {
	if err := CheckWorker(cfg, task); err != nil {
		return nil, err
	}
	cfg.WorkerDefaults()
	stopMetrics, err := job.StartMetrics(&cfg, "worker", metrics.Worker)
	if err != nil {
		return nil, err
	}
	defer stopMetrics()
	w := &ringWorker{cfg: cfg, log: cfg.Logger, task: task, rep: job.NewReporter(cfg.Reports), feeds: map[string]*phalanxpb.FeedRequest{}}
	defer w.close()
	if err := w.start(ctx); err != nil {
		return nil, err
	}
	return w.run(ctx)
}

// CheckWorker refuses, before anything starts, a worker RunWorker would.
func CheckWorker(cfg job.Config, task job.Task) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := cfg.CheckJoin(); err != nil {
		return err
	}
	switch {
	case task.Model == nil || task.Train == nil:
		return errors.New("phalanx: the task needs a Model and Train data")
	case cfg.Rescale == "lr" && cfg.ReferenceWorld < 1:
		return job.Invalid("ReferenceWorld", cfg.ReferenceWorld, `Rescale "lr" needs the world size Batch is meant for`)
	}
	return nil
}

// ringWorker is one worker process's runtime: what outlives a round (the
// model, optimizer, trainer and committed state, the actors, the
// checkpointer) and the goroutines around the rounds (probation, feeding,
// stop requests).
type ringWorker struct {
	cfg  job.Config
	log  *zap.Logger
	task job.Task
	rep  *job.Reporter

	tr    *collective.TCPTransport
	data  collective.Transport // the ring's: tr, or shared memory beside it
	sys   *actors.System
	coord *coordinator.Job
	store checkpoint.Store
	sup   *actors.Supervisor
	group *actor.PID // the group actor (the step leader when this worker is rank 0)
	agent *elastic.Agent
	id    string
	// runCtx is the worker's own context: it ends with the worker, not
	// with the caller's (whose end is a request to leave).
	runCtx context.Context

	feedMu     sync.Mutex
	feeds      map[string]*phalanxpb.FeedRequest // excluded workers waiting for parameters (rank 0 answers)
	probeMu    sync.Mutex                        // held by a round, and by each probation step
	probeStep  atomic.Int64                      // the ring's step, for fault injection while on probation (0: not on probation)
	progressAt atomic.Int64                      // the last step written to the progress key
	paceDead   atomic.Int64                      // the group actor's next deadline and overhead (nanoseconds), for the progress key
	paceOver   atomic.Int64
	generation atomic.Uint64 // the generation it trains in
	stopAsked  atomic.Bool   // a stop request came before the checkpointer existed
	leaving    atomic.Bool   // ctx was cancelled: stop at the next boundary and leave
	stoppedAt  atomic.Int64  // the step a requested stop ended the job at (0: none)

	mu      sync.Mutex
	ckpt    *checkpoint.Checkpointer
	trainer *worker.Trainer
	params  []*nn.Param
	slots   []nn.Tensor // the optimizer's
	result  *job.Result
	undo    []func()
}

// start opens what the worker runs on: the data plane, the actor system
// and its supervisor, the etcd client and the checkpoint store.
func (w *ringWorker) start(ctx context.Context) error {
	c := &w.cfg
	dp, err := job.OpenDataPlane(c, w.log)
	if err != nil {
		return err
	}
	tr, hostID := dp.TCP, dp.HostID
	w.tr, w.data = tr, dp.Transport
	w.undo = append(w.undo, func() { tr.Close() })
	if plant.On(plant.LeakProcess) {
		plant.Orphan() // planted: a helper process the worker forgets
	}
	host, _, err := net.SplitHostPort(tr.Addr())
	if err != nil {
		return err
	}
	// The control plane listens where peers reach this host: the data
	// plane's advertised host; or, bound to every interface, every
	// interface too, advertising that host.
	sec, err := job.LoadSecurity(c)
	if err != nil {
		return err
	}
	ao := actors.Options{Logger: w.log, Remote: true, Bind: net.JoinHostPort(host, "0"), ServerTLS: sec.Server(), ClientTLS: sec.Client()}
	if bh, _, err := net.SplitHostPort(c.Bind); err == nil && netaddr.Unspecified(bh) {
		ao.Bind, ao.Advertise = net.JoinHostPort(bh, "0"), host
	}
	sys, err := actors.NewSystem(ao)
	if err != nil {
		return err
	}
	w.sys = sys
	w.undo = append(w.undo, sys.Shutdown, sys.Quiet)
	cli, err := job.DialEtcd(ctx, c, w.log)
	if err != nil {
		return err
	}
	w.undo = append(w.undo, func() { cli.Close() })
	keys, err := coordinator.KeysFor(c.Job)
	if err != nil {
		return job.Invalid("Job", c.Job, "%v", err)
	}
	w.coord = coordinator.NewJob(cli, keys)
	if c.Checkpoint.Location != "" {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		w.store, err = checkpoint.OpenURL(sctx, c.Checkpoint.Location, c.Credentials)
		cancel()
		if err != nil {
			return fmt.Errorf("phalanx: checkpoint store: %w", err)
		}
	}
	var policy *hybrid.Policy
	if c.Sync.Mode == "hybrid" {
		p, _ := c.Sync.Policy() // validated
		policy = &p
	}
	sup, pids, err := actors.Supervise(sys, "job", c.Restarts, w.log, actors.Child{Name: "group", Props: worker.NewGroupProps(worker.GroupConfig{
		Logger:    w.log,
		Hybrid:    policy,
		Now:       c.Now,
		OnExclude: w.exclude,
		OnPace: func(deadline, overhead time.Duration) {
			w.paceDead.Store(int64(deadline))
			w.paceOver.Store(int64(overhead))
		},
		OnFallback: func(f worker.Fallback) {
			late := make([]int, len(f.Late))
			for i, r := range f.Late {
				late[i] = int(r)
			}
			w.rep.Send(OverlapFallback{Step: f.Step, Late: late, DeadlineS: f.Deadline.Seconds()})
		},
	})})
	if err != nil {
		return err
	}
	w.sup, w.group = sup, pids[0]
	w.agent, err = elastic.New(elastic.Config{Coord: w.coord, Job: c.Job, Transport: w.data,
		HostIdentity: hostID, Collective: collective.Options{Timeout: c.OpTimeout, Logger: w.log, Observer: c.Observer()},
		DataAddr: tr.Addr(), ControlAddr: sys.Address(), RankHint: c.RankHint, ConfigHash: jobHash(c),
		Capabilities: []string{"allreduce", "model:" + c.Model},
		LeaseTTL:     c.LeaseTTL, Unreachable: c.Unreachable, Logger: w.log, Now: c.Now})
	if err != nil {
		return err
	}
	w.id = w.agent.ID()
	return nil
}

// run is the worker's life in the job: the elastic agent's rounds, and
// beside them the goroutines that watch for stop requests, probation and
// feeds, and for ctx's end (leave).
func (w *ringWorker) run(ctx context.Context) (*job.Result, error) {
	c := &w.cfg
	// ctx's end is a request to leave, not an abort: the rounds run on.
	runCtx, abort := context.WithCancelCause(context.WithoutCancel(ctx))
	defer abort(nil)
	w.runCtx = runCtx
	aux, stopAux := context.WithCancel(runCtx)
	var wg sync.WaitGroup
	defer wg.Wait() // before the etcd client closes
	defer stopAux()
	goAux := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(aux) }()
	}
	goAux(func(aux context.Context) { w.leaveWhenDone(w.agent, ctx, aux, abort) })
	goAux(w.watchStop)
	if c.Sync.Mode == "hybrid" {
		goAux(w.probation)
		goAux(w.watchFeeds)
	}
	w.rep.Send(job.Registered{ID: w.id, Pid: os.Getpid()})
	err := w.agent.Run(runCtx, w.round)
	var stopped *elastic.StoppedError
	switch {
	case errors.As(err, &stopped):
		w.finalCheckpoint(runCtx, stopped)
		return nil, stopped
	case errors.Is(err, elastic.ErrLeft):
		w.rep.Send(job.Left{ID: w.id, Pid: os.Getpid()})
		return nil, job.ErrLeft
	case err != nil:
		if cause := context.Cause(runCtx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return nil, err
	}
	if s := w.stoppedAt.Load(); s > 0 {
		return nil, &job.StoppedError{Step: s, Requested: true}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.result == nil {
		return nil, errors.New("phalanx: the job is done, but not by this worker's ring (it was done before this worker joined)")
	}
	return w.result, nil
}

// departer records a worker's departure and gives up its lease
// (elastic.Agent does).
type departer interface {
	Leave(ctx context.Context, reason string) error
}

// leaveWhenDone makes the worker leave the job through d once leave ends
// (the caller's context), unless ctx (the run's own) ends first; the rounds
// stop at the next step boundary. If the worker is not out within the bound,
// the run is aborted.
func (w *ringWorker) leaveWhenDone(d departer, leave, ctx context.Context, abort context.CancelCauseFunc) {
	select {
	case <-ctx.Done():
		return
	case <-leave.Done():
	}
	w.leaving.Store(true)
	// Not under ctx: the flag just set ends the run at the next step
	// boundary, and with it ctx, which must not cancel the departure's
	// record on its way (the lease would still go, and the coordinator
	// would name the worker lost by its lease, not left).
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.LeaseTTL)
	err := d.Leave(lctx, "asked to leave: "+context.Cause(leave).Error())
	cancel()
	if err != nil {
		w.log.Warn("leaving the job", zap.Error(err))
	}
	bound := max(30*time.Second, w.cfg.OpTimeout)
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-t.C:
		abort(fmt.Errorf("asked to leave, and not out of the ring within %v", bound))
	case <-ctx.Done():
	}
}

// watchStop turns the job's stop request into a stop vote at the next
// step boundary: every rank then stops there after a final checkpoint.
func (w *ringWorker) watchStop(ctx context.Context) {
	reason, err := w.coord.WaitStop(ctx)
	if err != nil {
		return
	}
	w.log.Warn("the job is asked to stop: final checkpoint at the next step boundary", zap.String("reason", reason))
	w.stopAsked.Store(true)
	if ck := w.checkpointer(); ck != nil {
		ck.RequestStop()
	}
}

// exclude asks the coordinator to keep a straggler out (the group actor
// decided it); not on the group actor's goroutine.
func (w *ringWorker) exclude(e worker.Exclusion) {
	x := &phalanxpb.Exclusion{Id: e.ID, Generation: w.generation.Load(), LateIn: int32(e.LateIn), Window: int32(e.Window), Step: e.Step,
		RequestedBy: w.id, RequestedUnixNano: w.cfg.Now().UnixNano(), DeadlineNanos: int64(e.Deadline), OverheadNanos: int64(e.Overhead)}
	w.log.Warn("excluding a straggler", zap.String("worker", e.ID), zap.Int("late_in", e.LateIn), zap.Int("window", e.Window),
		zap.Duration("deadline", e.Deadline), zap.Duration("overhead", e.Overhead))
	go func() {
		ectx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.coord.Exclude(ectx, x); err != nil {
			w.log.Warn("asking the coordinator to exclude a straggler", zap.String("worker", e.ID), zap.Error(err))
		}
	}()
}

func (w *ringWorker) close() {
	if t := w.currentTrainer(); t != nil {
		t.Close()
	}
	if ck := w.checkpointer(); ck != nil {
		ctx, cancel := context.WithTimeout(context.Background(), w.cfg.Checkpoint.Wait)
		if err := ck.Close(ctx); err != nil {
			w.log.Warn("closing the checkpointer", zap.Error(err))
		}
		cancel()
	}
	if w.sup != nil {
		w.sup.Close()
	}
	for i := len(w.undo) - 1; i >= 0; i-- {
		w.undo[i]()
	}
}

func (w *ringWorker) checkpointer() *checkpoint.Checkpointer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ckpt
}

func (w *ringWorker) currentTrainer() *worker.Trainer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.trainer
}

// finalCheckpoint: the coordinator stopped the job (too few workers) and
// the survivors have no ring to checkpoint with. Each holds the job's last
// commit; the one that claims the job's final checkpoint writes it alone.
func (w *ringWorker) finalCheckpoint(ctx context.Context, stopped *elastic.StoppedError) {
	ck, t := w.checkpointer(), w.currentTrainer()
	if ck == nil || t == nil {
		return
	}
	if _, err := t.Rollback(); err != nil {
		w.log.Warn("no final checkpoint: no committed state", zap.Error(err))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Checkpoint.Wait)
	defer cancel()
	var won bool
	err := coordinator.Retry(ctx, w.cfg.Checkpoint.Wait, func(err error) {
		w.log.Warn("claiming the final checkpoint: etcd unavailable; retrying", zap.Error(err))
	}, func(ctx context.Context) (err error) {
		won, err = w.coord.ClaimFinalCheckpoint(ctx, fmt.Sprintf("%s (pid %d)", w.id, os.Getpid()))
		return err
	})
	if err != nil {
		w.log.Warn("no final checkpoint", zap.Error(err))
	}
	if !won {
		return
	}
	s := t.State()
	if _, err := ck.SaveAlone(ctx, checkpoint.Progress{Step: s.Step, Epoch: s.Position.Epoch, Offset: s.Position.Offset}, stopped.Generation); err != nil {
		w.log.Warn("the final checkpoint failed", zap.Error(err))
	}
}
