package ring

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// A straggler excluded in hybrid mode is on probation: it keeps computing
// steps on its own (no update) at the ring's current step, times them
// against the deadline it missed, and asks to be readmitted once enough of
// them in a row would have met it. Meanwhile it keeps receiving the ring's
// parameters: it asks for them (a feed request in etcd), and rank 0 of the
// ring, between two steps, copies its parameters and broadcasts them over a
// two-rank group of the same data-plane transport. The feed's collectives
// are a group of their own, so they never interleave with the ring's.

// probation runs while the worker lives: each time it is excluded, it
// probes until it keeps pace, then asks to be readmitted.
func (w *ringWorker) probation(ctx context.Context) {
	for ctx.Err() == nil {
		x, err := w.coord.WaitExcluded(ctx, w.id)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("an unreadable exclusion record", zap.Error(err))
			}
			return
		}
		pr := hybrid.Probation{Deadline: time.Duration(x.DeadlineNanos), Overhead: max(0, time.Duration(x.OverheadNanos)),
			ReadmitAfter: w.cfg.Sync.ReadmitAfter}
		w.log.Warn("excluded as a straggler: on probation", zap.Duration("deadline", pr.Deadline), zap.Duration("overhead", pr.Overhead))
		for probes := 0; ctx.Err() == nil; probes++ {
			if probes%5 == 0 { // keep receiving the ring's parameters
				if step, err := w.requestFeed(ctx); err != nil {
					w.log.Warn("receiving the ring's parameters", zap.Error(err))
				} else {
					w.rep.Send(Fed{ID: w.id, Step: step})
				}
			}
			d, err := w.probe(ctx, &pr)
			if err != nil {
				w.log.Warn("probation step", zap.Error(err))
				return
			}
			if pr.Observe(d) {
				break
			}
		}
		w.probeStep.Store(0)
		if ctx.Err() != nil {
			return
		}
		if err := w.coord.Readmit(ctx, w.id); err != nil {
			w.log.Warn("asking to be readmitted", zap.Error(err))
			return
		}
		w.log.Warn("kept pace on probation: asked to be readmitted")
	}
}

// probe times one step's computation at the ring's current step, and
// updates pr to the ring's current pace.
func (w *ringWorker) probe(ctx context.Context, pr *hybrid.Probation) (time.Duration, error) {
	w.probeMu.Lock()
	defer w.probeMu.Unlock()
	t := w.currentTrainer()
	if t == nil {
		return 0, errors.New("no trainer")
	}
	if p, err := w.coord.ReadPace(ctx); err != nil {
		w.log.Warn("reading the ring's pace", zap.Error(err))
	} else if p != nil {
		w.probeStep.Store(p.Step)
		if p.DeadlineNanos > 0 {
			pr.Deadline, pr.Overhead = time.Duration(p.DeadlineNanos), max(0, time.Duration(p.OverheadNanos))
		}
	}
	if _, err := t.Rollback(); err != nil { // the last commit: probing changes nothing
		return 0, err
	}
	start := w.cfg.Now()
	err := t.Compute(ctx)
	return w.cfg.Now().Sub(start), err
}

// feedJob names the two-rank group that feeds worker id.
func feedJob(job, id string) string { return job + "/feed/" + id }

// requestFeed asks rank 0 of the current ring for its parameters and
// copies them in; it returns the step they are of.
func (w *ringWorker) requestFeed(ctx context.Context) (int64, error) {
	g, _, err := w.coord.CurrentGeneration(ctx)
	if err != nil || g == nil || len(g.Members) == 0 {
		return 0, fmt.Errorf("no ring to be fed by (%v)", err)
	}
	req := &phalanxpb.FeedRequest{Id: w.id, DataAddr: w.tr.Addr(), Generation: uint64(w.cfg.Now().UnixNano())}
	if err := w.coord.RequestFeed(ctx, req); err != nil {
		return 0, err
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	grp, err := collective.Join(fctx, w.tr, collective.Membership{Job: feedJob(w.cfg.Job, w.id), Generation: req.Generation, Rank: 1,
		Peers: []string{g.Members[0].DataAddr, w.tr.Addr()}}, collective.Options{Timeout: 30 * time.Second, Logger: w.log})
	if err != nil {
		return 0, fmt.Errorf("joining rank 0's feed: %w", err)
	}
	defer grp.Close()
	bufs := make([][]float32, len(w.params))
	for i, p := range w.params {
		bufs[i] = make([]float32, len(p.Value))
	}
	step, err := feedTransfer(fctx, grp, bufs, 0)
	if err != nil {
		return 0, err
	}
	w.probeMu.Lock()
	defer w.probeMu.Unlock()
	for i, p := range w.params {
		copy(p.Value, bufs[i])
	}
	w.currentTrainer().State().Commit() // a probe's rollback keeps them
	return step, nil
}

// feedTransfer broadcasts the step and the tensors from rank 0.
func feedTransfer(ctx context.Context, grp *collective.Group, tensors [][]float32, step int64) (int64, error) {
	hdr := []float64{0, 0}
	if grp.Rank() == 0 {
		hdr[0], hdr[1] = float64(len(tensors)), float64(step)
	}
	if err := grp.Broadcast(ctx, collective.Float64s(hdr), 0); err != nil {
		return 0, err
	}
	if int(hdr[0]) != len(tensors) {
		return 0, fmt.Errorf("the feed has %v tensors, this model %d", hdr[0], len(tensors))
	}
	for _, t := range tensors {
		if err := grp.Broadcast(ctx, collective.Float32s(t), 0); err != nil {
			return 0, err
		}
	}
	return int64(hdr[1]), nil
}

// watchFeeds collects excluded workers' requests for parameters; rank 0
// answers them between steps (serveFeeds).
func (w *ringWorker) watchFeeds(ctx context.Context) {
	w.coord.WatchFeeds(ctx, func(r *phalanxpb.FeedRequest) {
		w.feedMu.Lock()
		w.feeds[r.Id] = r // the latest request of each worker
		w.feedMu.Unlock()
	})
}

// serveFeeds answers the pending requests with a copy of the parameters,
// taken now (between steps), sent on goroutines of their own. A feed
// lives in the worker's context, not the round's: the round that serves
// a straggler's first request often ends at once, since excluding it
// makes a new ring, and a feed cut short with it left the straggler
// trying to reach rank 0 for seconds (TestHybridExcludesStraggler
// failed once so).
func (w *ringWorker) serveFeeds(step int64) {
	ctx := w.runCtx
	w.feedMu.Lock()
	reqs := w.feeds
	w.feeds = map[string]*phalanxpb.FeedRequest{}
	w.feedMu.Unlock()
	if len(reqs) == 0 {
		return
	}
	snap := make([][]float32, len(w.params))
	for i, p := range w.params {
		snap[i] = append([]float32(nil), p.Value...)
	}
	for _, req := range reqs {
		go func() {
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			grp, err := collective.Join(fctx, w.tr, collective.Membership{Job: feedJob(w.cfg.Job, req.Id), Generation: req.Generation, Rank: 0,
				Peers: []string{w.tr.Addr(), req.DataAddr}}, collective.Options{Timeout: 30 * time.Second, Logger: w.log})
			if err == nil {
				_, err = feedTransfer(fctx, grp, snap, step)
				grp.Close()
			}
			if err != nil {
				w.log.Warn("feeding an excluded worker", zap.String("worker", req.Id), zap.Error(err))
			}
			if err := w.coord.FeedServed(fctx, req.Id); err != nil {
				w.log.Warn("removing a feed request", zap.Error(err))
			}
			w.log.Info("fed an excluded worker", zap.String("worker", req.Id), zap.Int64("step", step))
		}()
	}
}
