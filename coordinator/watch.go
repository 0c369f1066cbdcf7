package coordinator

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
