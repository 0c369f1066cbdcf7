package elastic

import (
	"context"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
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

func startWatch(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, log *zap.Logger) *watch {
	w := &watch{changed: make(chan struct{})}
	go w.run(ctx, cli, keys, log)
	return w
}

// Follow watches a job's generations: f is called with each generation
// record as it is written (and with the current one first), until ctx ends.
// It is how a launcher or an operator tool follows a job.
func Follow(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, log *zap.Logger, f func(*phalanxpb.Generation)) error {
	w := startWatch(ctx, cli, keys, log)
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

func (w *watch) run(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, log *zap.Logger) {
	for ctx.Err() == nil {
		resp, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.Generation()), clientv3.OpGet(keys.Done(), clientv3.WithCountOnly())).Commit()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("reading the generation", zap.Error(err))
			}
			pause(ctx, 200*time.Millisecond)
			continue
		}
		if !w.apply(keys, first(resp.Responses[0].GetResponseRange().Kvs), resp.Responses[1].GetResponseRange().Count > 0) {
			return
		}
		wctx, cancel := context.WithCancel(ctx)
		wch := cli.Watch(wctx, keys.Prefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if err := wr.Err(); err != nil && ctx.Err() == nil {
				log.Warn("watching the generation", zap.Error(err))
				break // read again
			}
			for _, ev := range wr.Events {
				switch string(ev.Kv.Key) {
				case keys.Generation():
					if ev.Type == clientv3.EventTypePut && !w.apply(keys, ev.Kv, false) {
						cancel()
						return
					}
				case keys.Done():
					if ev.Type == clientv3.EventTypePut {
						w.set(func() { w.done = true })
					}
				}
			}
		}
		cancel()
	}
}

// apply records a generation record (kv may be nil) and done; false when the
// record is corrupt, which ends the watch with an error.
func (w *watch) apply(keys coordinator.Keys, kv *mvccpb.KeyValue, done bool) bool {
	var g *phalanxpb.Generation
	if kv != nil {
		var err error
		if g, err = coordinator.DecodeGeneration(keys.Generation(), kv.Value); err != nil {
			w.set(func() { w.err = err })
			return false
		}
	}
	w.set(func() {
		if g != nil && (w.gen == nil || g.Number > w.gen.Number) {
			w.gen = g
		}
		w.done = w.done || done
	})
	return true
}

func first(kvs []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
