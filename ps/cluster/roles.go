package cluster

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
)

// takeRoles applies each shard map from maps newer than the last applied,
// until maps closes or ctx ends. A failed apply (a backup not yet
// reachable) is retried after retry(failures), or at once with a newer map
// when one comes first: a map is never abandoned while it is the newest.
func takeRoles(ctx context.Context, maps <-chan *phalanxpb.ShardMap, apply func(context.Context, *phalanxpb.ShardMap) error,
	retry func(failures int) <-chan time.Time, log *zap.Logger) {
	var applied uint64
	var next *phalanxpb.ShardMap // to apply
	var wait <-chan time.Time    // non-nil: next failed; retry when it fires
	failures := 0
	for {
		if next != nil && wait == nil {
			if err := apply(ctx, next); err != nil {
				if ctx.Err() != nil {
					return
				}
				failures++
				log.Warn("taking the shard map's roles; retrying", zap.Uint64("generation", next.Generation),
					zap.Int("failures", failures), zap.Error(err))
				wait = retry(failures)
			} else {
				applied = next.Generation
				log.Info("shard map", zap.Uint64("generation", next.Generation), zap.String("reason", next.Reason))
				next, failures = nil, 0
			}
		}
		select {
		case m, ok := <-maps:
			if !ok {
				return
			}
			if m.Generation > applied && (next == nil || m.Generation > next.Generation) {
				next, wait, failures = m, nil, 0
			}
		case <-wait:
			wait = nil
		case <-ctx.Done():
			return
		}
	}
}

// retryAfter fires after retryDelay(failures).
func retryAfter(failures int) <-chan time.Time { return time.After(retryDelay(failures)) }

// retryDelay backs off from 100ms, doubling up to 5s.
func retryDelay(failures int) time.Duration {
	if failures < 1 || failures > 6 {
		return 5 * time.Second
	}
	return min(5*time.Second, 100*time.Millisecond<<(failures-1))
}

// apply gives each shard this server holds the role the map says:
// backups first, so that a new primary's links find them.
func apply(ctx context.Context, srv *ps.Server, id string, m *phalanxpb.ShardMap) error {
	addr := map[string]string{}
	for _, s := range m.Servers {
		addr[s.Id] = s.Addr
	}
	for _, p := range m.Shards {
		if p.Primary != id {
			if err := srv.SetRole(ctx, p.Shard, false, nil, m.Generation); err != nil {
				return err
			}
		}
	}
	for _, p := range m.Shards {
		if p.Primary != id {
			continue
		}
		var backups []string
		for _, b := range p.Backups {
			a, ok := addr[b]
			if !ok {
				return fmt.Errorf("cluster: shard %d's backup %s is not in the map's servers", p.Shard, b)
			}
			backups = append(backups, a)
		}
		if err := srv.SetRole(ctx, p.Shard, true, backups, m.Generation); err != nil {
			return err
		}
	}
	return nil
}
