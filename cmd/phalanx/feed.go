package main

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// An excluded straggler keeps receiving the ring's parameters: it asks for
// them (a FeedRequest in etcd), and rank 0 of the ring, between two steps,
// copies its parameters and broadcasts them over a two-rank group of the
// same data-plane transport. The feed's collectives are a group of their
// own, so they never interleave with the ring's.

// feedJob names the two-rank group that feeds worker id.
func feedJob(job, id string) string { return job + "/feed/" + id }

// requestFeed asks rank 0 of the current ring for its parameters and
// copies them in; it returns the step they are of.
func (w *elasticWorker) requestFeed(ctx context.Context) (int64, error) {
	resp, err := w.cli.Get(ctx, w.keys.Generation())
	if err != nil || len(resp.Kvs) == 0 {
		return 0, fmt.Errorf("no generation to be fed by: %v", err)
	}
	g, err := coordinator.DecodeGeneration(w.keys.Generation(), resp.Kvs[0].Value)
	if err != nil || len(g.Members) == 0 {
		return 0, fmt.Errorf("no ring to be fed by: %v", err)
	}
	req := &phalanxpb.FeedRequest{Id: w.id, DataAddr: w.tr.Addr(), Generation: uint64(time.Now().UnixNano())}
	val, _ := proto.Marshal(req)
	if _, err := w.cli.Put(ctx, w.keys.Feed(w.id), string(val)); err != nil {
		return 0, err
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	grp, err := collective.Join(fctx, w.tr, collective.Membership{Job: feedJob(w.c.member.job, w.id), Generation: req.Generation, Rank: 1,
		Peers: []string{g.Members[0].DataAddr, w.tr.Addr()}}, collective.Options{Timeout: 30 * time.Second, Logger: w.log})
	if err != nil {
		return 0, fmt.Errorf("joining rank 0's feed: %w", err)
	}
	defer grp.Close()
	params := w.model.Params()
	bufs := make([][]float32, len(params))
	for i, p := range params {
		bufs[i] = make([]float32, len(p.Value))
	}
	step, err := feedTransfer(fctx, grp, bufs, 0)
	if err != nil {
		return 0, err
	}
	w.probeMu.Lock()
	defer w.probeMu.Unlock()
	for i, p := range params {
		copy(p.Value, bufs[i])
	}
	w.trainer.State().Commit() // a probe's rollback keeps them
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
func (w *elasticWorker) watchFeeds(ctx context.Context) {
	for wr := range w.cli.Watch(ctx, w.keys.Feeds(), clientv3.WithPrefix()) {
		for _, e := range wr.Events {
			if e.Type != clientv3.EventTypePut {
				continue
			}
			var req phalanxpb.FeedRequest
			if err := proto.Unmarshal(e.Kv.Value, &req); err != nil || req.Id == "" {
				continue
			}
			w.feedMu.Lock()
			w.feeds[req.Id] = &req // the latest request of each worker
			w.feedMu.Unlock()
		}
	}
}

// serveFeeds answers the pending requests with a copy of params, taken now
// (between steps), sent on goroutines of their own.
func (w *elasticWorker) serveFeeds(ctx context.Context, params []*nn.Param, step int64) {
	w.feedMu.Lock()
	reqs := w.feeds
	w.feeds = map[string]*phalanxpb.FeedRequest{}
	w.feedMu.Unlock()
	if len(reqs) == 0 {
		return
	}
	snap := make([][]float32, len(params))
	for i, p := range params {
		snap[i] = append([]float32(nil), p.Value...)
	}
	for _, req := range reqs {
		go func() {
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			grp, err := collective.Join(fctx, w.tr, collective.Membership{Job: feedJob(w.c.member.job, req.Id), Generation: req.Generation, Rank: 0,
				Peers: []string{w.tr.Addr(), req.DataAddr}}, collective.Options{Timeout: 30 * time.Second, Logger: w.log})
			if err == nil {
				_, err = feedTransfer(fctx, grp, snap, step)
				grp.Close()
			}
			if err != nil {
				w.log.Warn("feeding an excluded worker", zap.String("worker", req.Id), zap.Error(err))
			}
			w.cli.Delete(fctx, w.keys.Feed(req.Id))
			w.log.Info("fed an excluded worker", zap.String("worker", req.Id), zap.Int64("step", step))
		}()
	}
}
