package coordinator

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The package's watches: one way to watch after a read, and the two waits
// built on it.

// watchAfterRead is how this package follows etcd keys without missing a
// change: it watches key (opts: clientv3.WithPrefix, say) from the
// revision after rev, the revision of the read the caller has just acted
// on (its header revision; a single key's mod revision misses nothing
// either, but is compacted sooner). Every change after that read comes as
// an event, one made before the watch was set up included, and nothing
// the read saw comes again. A watch whose revision was compacted sends one
// response whose Err is rpctypes.ErrCompacted and closes: the caller reads
// again, or gives up. The watch ends with stop, or with ctx; its channel
// closes then.
func watchAfterRead(ctx context.Context, cli *clientv3.Client, rev int64, key string, opts ...clientv3.OpOption) (wch clientv3.WatchChan, stop context.CancelFunc) {
	wctx, stop := context.WithCancel(ctx)
	return cli.Watch(wctx, key, append(opts, clientv3.WithRev(rev+1))...), stop
}

// awaitPut waits for a write to key after revision rev, or for the watch
// to fail (a compaction, say): either way the caller reads the key again.
func awaitPut(ctx context.Context, cli *clientv3.Client, key string, rev int64) error {
	wch, stop := watchAfterRead(ctx, cli, rev, key)
	defer stop()
	for wr := range wch {
		if wr.Err() != nil {
			return nil
		}
		for _, e := range wr.Events {
			if e.Type == clientv3.EventTypePut {
				return nil
			}
		}
	}
	return ctx.Err()
}

// waitChange returns when a key under prefix changes after rev, after wake
// (when not negative), or with an error when the session or ctx ends.
func waitChange(ctx context.Context, cli *clientv3.Client, sess *concurrency.Session, prefix string, rev int64, wake time.Duration) error {
	wch, stop := watchAfterRead(ctx, cli, rev, prefix, clientv3.WithPrefix())
	defer stop()
	var timer <-chan time.Time
	if wake >= 0 {
		t := time.NewTimer(wake)
		defer t.Stop()
		timer = t.C
	}
	select {
	case resp, ok := <-wch:
		if !ok {
			return fmt.Errorf("%w: watch closed", ErrLeadershipLost)
		}
		if err := resp.Err(); IsTransient(err) {
			pause(ctx, 100*time.Millisecond) // the caller reads again; not in a spin
		} else if err != nil {
			return fmt.Errorf("coordinator: watching %s: %w", prefix, err)
		}
		return nil
	case <-timer:
		return nil
	case <-sess.Done():
		return fmt.Errorf("%w: election session expired", ErrLeadershipLost)
	case <-ctx.Done():
		return ctx.Err()
	}
}
