package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// PlaceShards is the first shard map of servers (sorted by id): shard s's
// primary is server s mod n and its replicas backups the next servers
// round the ring, so that primaries and backups spread evenly.
func PlaceShards(shards, replicas int, servers []*phalanxpb.PSServer) (*phalanxpb.ShardMap, error) {
	n := len(servers)
	switch {
	case shards < 1:
		return nil, fmt.Errorf("coordinator: %d shards", shards)
	case n == 0:
		return nil, errors.New("coordinator: no parameter servers to place shards on")
	case replicas < 0 || replicas >= n:
		return nil, fmt.Errorf("coordinator: %d replicas of each shard need more than %d servers", replicas, n)
	}
	srv := slices.Clone(servers)
	slices.SortFunc(srv, func(a, b *phalanxpb.PSServer) int { return strings.Compare(a.Id, b.Id) })
	m := &phalanxpb.ShardMap{Generation: 1, Servers: srv, Reason: fmt.Sprintf("%d shards on %d servers, %d backups each", shards, n, replicas)}
	for s := range shards {
		p := &phalanxpb.ShardPlacement{Shard: uint32(s), Primary: srv[s%n].Id}
		for r := 1; r <= replicas; r++ {
			p.Backups = append(p.Backups, srv[(s+r)%n].Id)
		}
		m.Shards = append(m.Shards, p)
	}
	return m, nil
}

// ErrShardLost: a shard's primary and every backup are gone; its
// parameters are lost (restore them from a checkpoint).
var ErrShardLost = errors.New("coordinator: a shard lost its primary and every backup")

// Reassign is the shard map after the servers not in live are gone: a shard
// whose primary is gone gets its first live backup as primary (a failover);
// gone backups are dropped. It returns nil when nothing changes, and
// ErrShardLost when a shard has no live copy.
func Reassign(cur *phalanxpb.ShardMap, live map[string]bool) (*phalanxpb.ShardMap, error) {
	next := &phalanxpb.ShardMap{Generation: cur.Generation + 1}
	changed := false
	var gone []string
	for _, s := range cur.Servers {
		if live[s.Id] {
			next.Servers = append(next.Servers, s)
		} else {
			gone = append(gone, s.Id)
			changed = true
		}
	}
	for _, p := range cur.Shards {
		np := &phalanxpb.ShardPlacement{Shard: p.Shard, Primary: p.Primary}
		for _, b := range p.Backups {
			if live[b] {
				np.Backups = append(np.Backups, b)
			}
		}
		if !live[p.Primary] {
			if len(np.Backups) == 0 {
				return nil, fmt.Errorf("%w: shard %d (primary %s)", ErrShardLost, p.Shard, p.Primary)
			}
			np.Primary, np.Backups = np.Backups[0], np.Backups[1:]
			next.Failovers = append(next.Failovers, &phalanxpb.Failover{Shard: p.Shard, Old: p.Primary, New: np.Primary})
		}
		next.Shards = append(next.Shards, np)
	}
	if !changed {
		return nil, nil
	}
	next.Reason = fmt.Sprintf("server %s gone", strings.Join(gone, ", "))
	return next, nil
}

// ShardMapConfig configures RunShardMap.
type ShardMapConfig struct {
	ID               string // this writer's id in the election
	Shards, Replicas int
	Servers          int // the first map waits for this many servers
	SessionTTL       time.Duration
	Logger           *zap.Logger
	OnMap            func(*phalanxpb.ShardMap)
	FirstMapTimeout  time.Duration // how long to wait for the servers (default 2 minutes)
	// OnLeadership observes this writer winning its election and
	// stepping down.
	OnLeadership func(Leadership)
}

// RunShardMap writes the parameter servers' shard map: once Servers have
// registered, the first one; then, whenever a server's registration goes
// (its lease expired: the process died), the map with its shards' backups
// promoted. It campaigns for the job's shard-map election first, so that
// standbys can run. It returns ErrShardLost when a shard has no copy left.
func (j *Job) RunShardMap(ctx context.Context, cfg ShardMapConfig) error {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.FirstMapTimeout == 0 {
		cfg.FirstMapTimeout = 2 * time.Minute
	}
	for {
		err := runShardMap(ctx, j.cli, j.keys, cfg)
		if ctx.Err() != nil || errors.Is(err, ErrShardLost) || err == nil {
			return err
		}
		cfg.Logger.Warn("not writing the shard map; campaigning again", zap.Error(err))
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

func runShardMap(ctx context.Context, cli *clientv3.Client, keys Keys, cfg ShardMapConfig) (err error) {
	// The session outlives ctx so that its Close revokes the lease (a
	// cancelled context would fail the revoke, noisily).
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(int(ttlSeconds(cfg.SessionTTL))), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return fmt.Errorf("coordinator: shard-map session: %w", err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, keys.PSElection())
	if err := el.Campaign(ctx, cfg.ID); err != nil {
		return fmt.Errorf("coordinator: shard-map campaign: %w", err)
	}
	f := fence{key: el.Key(), rev: el.Rev()}
	cfg.Logger.Info("writing the shard map", zap.String("election_key", f.key), zap.Int64("election_rev", f.rev))
	observe := func(l Leadership) {
		if cfg.OnLeadership != nil {
			cfg.OnLeadership(l)
		}
	}
	observe(Leadership{Leading: true, Key: f.key, Rev: f.rev})
	defer func() {
		lvl := zap.WarnLevel
		if err == nil || errors.Is(err, ErrShardLost) || ctx.Err() != nil {
			lvl = zap.InfoLevel
		}
		cfg.Logger.Log(lvl, "stepped down", zap.String("election_key", f.key), zap.Int64("election_rev", f.rev), zap.Error(err))
		observe(Leadership{Key: f.key, Rev: f.rev, Err: err})
	}()
	started := time.Now()
	// As in Coordinator.lead: transient etcd errors are retried while the
	// session lives, not taken for a lost leadership.
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	context.AfterFunc(sess.Ctx(), stop)
	retry := func(what string, op func(context.Context) error) error {
		return sessionEnded(sess.Ctx(), ctx, Retry(lctx, cfg.SessionTTL, func(err error) {
			cfg.Logger.Warn(what+": etcd unavailable; retrying", zap.Error(err))
		}, op))
	}
	for {
		var resp *clientv3.TxnResponse
		if err := retry("reading the parameter servers", func(ctx context.Context) (err error) {
			resp, err = readShardMapState(ctx, cli, keys, f)
			return err
		}); err != nil {
			return fmt.Errorf("coordinator: reading the parameter servers: %w", err)
		}
		live := map[string]bool{}
		var servers []*phalanxpb.PSServer
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			var s phalanxpb.PSServer
			if err := proto.Unmarshal(kv.Value, &s); err != nil || s.Id == "" {
				cfg.Logger.Error("ignoring a malformed parameter-server registration", zap.String("key", string(kv.Key)), zap.Error(err))
				continue
			}
			live[s.Id] = true
			servers = append(servers, &s)
		}
		var cur *phalanxpb.ShardMap
		var curRev int64
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			cur = &phalanxpb.ShardMap{}
			if err := proto.Unmarshal(kvs[0].Value, cur); err != nil {
				return fmt.Errorf("coordinator: %s is not a shard map: %w", keys.ShardMap(), err)
			}
			curRev = kvs[0].ModRevision
		}
		var next *phalanxpb.ShardMap
		wake := time.Duration(-1)
		switch {
		case cur == nil && len(servers) >= cfg.Servers:
			if next, err = PlaceShards(cfg.Shards, cfg.Replicas, servers[:cfg.Servers]); err != nil {
				return err
			}
		case cur == nil:
			left := cfg.FirstMapTimeout - time.Since(started)
			if left <= 0 {
				return fmt.Errorf("coordinator: %d of %d parameter servers registered within %v", len(servers), cfg.Servers, cfg.FirstMapTimeout)
			}
			wake = left
		default:
			if next, err = Reassign(cur, live); err != nil {
				return err
			}
		}
		if next != nil {
			val, err := proto.Marshal(next)
			if err != nil {
				return err
			}
			if err := retry("writing the shard map", func(ctx context.Context) error {
				return writeShardMap(ctx, cli, keys, f, curRev, val)
			}); err != nil {
				return fmt.Errorf("coordinator: writing the shard map: %w", err)
			}
			cfg.Logger.Info("shard map", zap.Uint64("generation", next.Generation), zap.String("reason", next.Reason))
			if cfg.OnMap != nil {
				cfg.OnMap(next)
			}
			continue
		}
		if err := waitChange(ctx, cli, sess, keys.Prefix()+"ps/", resp.Header.Revision, wake); err != nil {
			return err
		}
	}
}

// readShardMapState reads the parameter servers' registrations and the
// shard map under the fence: a deposed writer acts on no read made after
// it lost its key.
func readShardMapState(ctx context.Context, cli *clientv3.Client, keys Keys, f fence) (*clientv3.TxnResponse, error) {
	resp, err := cli.Txn(ctx).If(f.held()).Then(
		clientv3.OpGet(keys.PSServers(), clientv3.WithPrefix()),
		clientv3.OpGet(keys.ShardMap()),
	).Commit()
	if err == nil && !resp.Succeeded {
		err = f.lost("reading the parameter servers")
	}
	return resp, err
}

// writeShardMap puts val as the shard map if the writer still holds its
// fence and the map is still the one of revision curRev; else
// ErrLeadershipLost. A retry of a write whose answer was lost finds its
// own bytes, and counts as landed.
func writeShardMap(ctx context.Context, cli *clientv3.Client, keys Keys, f fence, curRev int64, val []byte) error {
	tx, err := cli.Txn(ctx).If(
		f.held(),
		clientv3.Compare(clientv3.ModRevision(keys.ShardMap()), "=", curRev),
	).Then(clientv3.OpPut(keys.ShardMap(), string(val))).Else(clientv3.OpGet(keys.ShardMap()), clientv3.OpGet(f.key)).Commit()
	switch {
	case err != nil:
		return err
	case tx.Succeeded || bytes.Equal(valueOf(tx), val):
		return nil
	}
	return f.refused("the shard map", tx)
}

// ReadShardMap reads the current shard map (nil before the first) and its
// revision.
func (j *Job) ReadShardMap(ctx context.Context) (*phalanxpb.ShardMap, int64, error) {
	resp, err := j.cli.Get(ctx, j.keys.ShardMap())
	if err != nil {
		return nil, 0, fmt.Errorf("coordinator: reading the shard map: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, resp.Header.Revision, nil
	}
	var m phalanxpb.ShardMap
	if err := proto.Unmarshal(resp.Kvs[0].Value, &m); err != nil {
		return nil, 0, fmt.Errorf("coordinator: %s is not a shard map: %w", j.keys.ShardMap(), err)
	}
	return &m, resp.Kvs[0].ModRevision, nil
}

// WatchShardMap calls f with the current shard map and each new one, until
// ctx ends or f returns false.
func (j *Job) WatchShardMap(ctx context.Context, f func(*phalanxpb.ShardMap) bool) error {
	m, rev, err := j.ReadShardMap(ctx)
	if err != nil {
		return err
	}
	if m != nil && !f(m) {
		return nil
	}
	wch, stop := watchAfterRead(ctx, j.cli, rev, j.keys.ShardMap())
	defer stop()
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("coordinator: watching the shard map: %w", err)
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			var m phalanxpb.ShardMap
			if err := proto.Unmarshal(ev.Kv.Value, &m); err != nil {
				return fmt.Errorf("coordinator: %s is not a shard map: %w", j.keys.ShardMap(), err)
			}
			if !f(&m) {
				return nil
			}
		}
	}
	return ctx.Err()
}

// valueOf is the value an Else branch's single get read, nil when none.
func valueOf(tx *clientv3.TxnResponse) []byte {
	if len(tx.Responses) == 0 {
		return nil
	}
	if kv := first(tx.Responses[0].GetResponseRange().Kvs); kv != nil {
		return kv.Value
	}
	return nil
}
