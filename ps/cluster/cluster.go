// Package cluster runs parameter servers and their clients against a job's
// records in etcd: the job's configuration (phalanxpb.PSJob), the servers'
// registrations and the coordinator's shard map. A server registers with a
// lease, hosts every shard and takes the role the map gives it (primary with
// its backups, or backup); a client's Directory follows the map, so that a
// request whose primary died goes to the promoted backup.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
)

// Spec is a PS job's configuration in the ps package's terms.
type Spec struct {
	Tables    []ps.TableSpec
	Sync      ps.SyncSpec
	Partition ps.Partition
	Shards    int
	Replicas  int
	Servers   int
}

// SpecOf checks a job record and converts it.
func SpecOf(j *phalanxpb.PSJob) (Spec, error) {
	var s Spec
	mode, err := ps.ParseMode(j.Consistency)
	if err != nil {
		return s, err
	}
	s.Sync = ps.SyncSpec{Mode: mode, Workers: int(j.Workers), Staleness: int(j.Staleness), Quorum: j.Quorum,
		Deadline: time.Duration(j.DeadlineNanos), Decay: j.Decay}
	if err := s.Sync.Validate(); err != nil {
		return s, err
	}
	if s.Partition, err = ps.ParsePartition(j.Partition); err != nil {
		return s, err
	}
	s.Shards, s.Replicas, s.Servers = int(j.Shards), int(j.Replicas), int(j.Servers)
	switch {
	case s.Shards < 1 || s.Shards > 1<<16:
		return s, fmt.Errorf("cluster: %d shards: want 1..65536", s.Shards)
	case s.Servers < 1 || s.Replicas < 0 || s.Replicas >= s.Servers:
		return s, fmt.Errorf("cluster: %d servers with %d backups of each shard: want 0 <= backups < servers", s.Servers, s.Replicas)
	case len(j.Tables) == 0:
		return s, errors.New("cluster: a job without tables")
	}
	for _, t := range j.Tables {
		opt, err := ps.ParseOptimizer(t.Optimizer)
		if err != nil {
			return s, err
		}
		var init ps.InitKind
		switch t.Init {
		case "", "zeros":
			init = ps.InitZeros
		case "uniform":
			init = ps.InitUniform
		case "normal":
			init = ps.InitNormal
		default:
			return s, fmt.Errorf("cluster: table %q: initialiser %q: want zeros, uniform or normal", t.Name, t.Init)
		}
		spec := ps.TableSpec{ID: t.Id, Name: t.Name, Dim: int(t.Dim), Rows: t.Rows, KeySpace: t.KeySpace, Init: init,
			InitScale: t.InitScale, Seed: t.Seed, Optimizer: opt, LR: t.Lr}
		if err := spec.Validate(); err != nil {
			return s, err
		}
		if _, err := ps.NewPartitioner(s.Partition, s.Shards, &spec); err != nil {
			return s, err
		}
		s.Tables = append(s.Tables, spec)
	}
	return s, nil
}

// WriteJob records a PS job's configuration (checked) for its servers and
// workers; a job already recorded must be the same.
func WriteJob(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, j *phalanxpb.PSJob) error {
	if _, err := SpecOf(j); err != nil {
		return err
	}
	return coordinator.WritePSJob(ctx, cli, keys, j)
}

// ReadJob waits until the job's configuration is recorded and returns it.
func ReadJob(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys) (*phalanxpb.PSJob, error) {
	return coordinator.ReadPSJob(ctx, cli, keys)
}

// NodeConfig configures a parameter server process.
type NodeConfig struct {
	ID       string // unique per process
	Listen   string // the data plane's address (127.0.0.1:0 picks a port)
	LeaseTTL time.Duration
	Logger   *zap.Logger
	// OnReady, when set, is told the data-plane address once registered.
	OnReady func(addr string)
}

// Serve runs a parameter server for the job until ctx ends, its lease is
// lost, or a shard actor fails beyond its restart budget.
func Serve(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, cfg NodeConfig) error {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	job, err := ReadJob(ctx, cli, keys)
	if err != nil {
		return err
	}
	spec, err := SpecOf(job)
	if err != nil {
		return err
	}
	sys, err := actors.NewSystem(actors.Options{Logger: log.Named("actors")})
	if err != nil {
		return err
	}
	defer sys.Shutdown()
	srv, err := ps.Listen(ps.ServerConfig{Addr: cfg.Listen, Tables: spec.Tables, Sync: spec.Sync, System: sys, Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()
	for s := range spec.Shards {
		if err := srv.Host(ctx, uint32(s)); err != nil {
			return err
		}
	}
	if job.RestoreFrom != "" { // before registering: no worker sees the shards empty
		store, err := checkpoint.OpenURL(ctx, job.Checkpoint, checkpoint.Credentials{})
		if err != nil {
			return err
		}
		m, snaps, err := Load(ctx, store, job.RestoreFrom)
		if err != nil {
			return err
		}
		if err := Restore(ctx, srv, spec, snaps); err != nil {
			return err
		}
		log.Info("restored", zap.Int64("step", m.Step), zap.Int("from_shards", m.Shards), zap.Int("shards", spec.Shards))
	}
	host, _ := os.Hostname()
	lease, err := coordinator.RegisterAt(ctx, cli, keys.PSServer(cfg.ID), &phalanxpb.PSServer{Id: cfg.ID, Addr: srv.Addr(), Pid: int64(os.Getpid()), Host: host}, cfg.LeaseTTL)
	if err != nil {
		return err
	}
	defer lease.Close(context.WithoutCancel(ctx))
	if cfg.OnReady != nil {
		cfg.OnReady(srv.Addr())
	}
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, 1)
	go func() {
		select {
		case <-lease.Lost():
			failed <- errors.New("cluster: this server's lease was lost: it is out of the shard map")
		case err := <-srv.GaveUp():
			failed <- fmt.Errorf("cluster: a shard actor failed beyond its restarts: %w", err)
		case <-mctx.Done():
			return
		}
		cancel()
	}()
	var applied uint64
	err = coordinator.WatchShardMap(mctx, cli, keys, func(m *phalanxpb.ShardMap) bool {
		if m.Generation <= applied {
			return true
		}
		if err := apply(mctx, srv, cfg.ID, m); err != nil {
			log.Error("taking the shard map's roles", zap.Uint64("generation", m.Generation), zap.Error(err))
			return mctx.Err() == nil
		}
		applied = m.Generation
		log.Info("shard map", zap.Uint64("generation", m.Generation), zap.String("reason", m.Reason))
		return true
	})
	select {
	case f := <-failed:
		return f
	default:
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
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

// Directory is a ps.Directory that follows the job's shard map in etcd.
type Directory struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced with each new map
	m       *phalanxpb.ShardMap
	addr    map[string]string
	err     error
}

// NewDirectory follows the shard map until ctx ends; it waits for the first.
func NewDirectory(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys) (*Directory, error) {
	d := &Directory{changed: make(chan struct{})}
	first := make(chan struct{})
	go func() {
		err := coordinator.WatchShardMap(ctx, cli, keys, func(m *phalanxpb.ShardMap) bool {
			d.set(m)
			select {
			case <-first:
			default:
				close(first)
			}
			return true
		})
		d.mu.Lock()
		d.err = fmt.Errorf("cluster: the shard map is no longer followed: %w", cmpErr(err, ctx.Err()))
		close(d.changed)
		d.changed = make(chan struct{})
		d.mu.Unlock()
	}()
	select {
	case <-first:
		return d, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	if b != nil {
		return b
	}
	return errors.New("watch ended")
}

func (d *Directory) set(m *phalanxpb.ShardMap) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m != nil && m.Generation <= d.m.Generation {
		return
	}
	d.m = m
	d.addr = map[string]string{}
	for _, s := range m.Servers {
		d.addr[s.Id] = s.Addr
	}
	close(d.changed)
	d.changed = make(chan struct{})
}

// Map is the latest shard map.
func (d *Directory) Map() *phalanxpb.ShardMap {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m
}

// Primary implements ps.Directory.
func (d *Directory) Primary(shard int) (string, uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return "", 0, d.err
	}
	if shard < 0 || shard >= len(d.m.Shards) {
		return "", d.m.Generation, fmt.Errorf("cluster: no shard %d in a map of %d", shard, len(d.m.Shards))
	}
	a, ok := d.addr[d.m.Shards[shard].Primary]
	if !ok {
		return "", d.m.Generation, fmt.Errorf("cluster: shard %d's primary %s has no address", shard, d.m.Shards[shard].Primary)
	}
	return a, d.m.Generation, nil
}

// Changed implements ps.Directory.
func (d *Directory) Changed(ctx context.Context, generation uint64) error {
	for {
		d.mu.Lock()
		if d.err != nil {
			d.mu.Unlock()
			return d.err
		}
		if d.m.Generation > generation {
			d.mu.Unlock()
			return nil
		}
		ch := d.changed
		d.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
