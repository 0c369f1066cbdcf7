// Package cluster runs parameter servers and their clients against a job's
// records in etcd: the job's configuration (phalanxpb.PSJob), the servers'
// registrations and the coordinator's shard map. A server registers with a
// lease, hosts every shard and takes the role the map gives it (primary with
// its backups, or backup); a client's Directory follows the map, so that a
// request whose primary died goes to the promoted backup.
package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"

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
// registerRetryBudget bounds how long a server retries its registration
// through transient etcd errors (an election in the etcd cluster).
const registerRetryBudget = 30 * time.Second

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
	names := map[uint32]string{} // by id
	for _, t := range j.Tables {
		// Servers would refuse the job only when hosting its shards, and a
		// client would keep one of the two.
		if other, ok := names[t.Id]; ok {
			return s, fmt.Errorf("cluster: table id %d given twice (tables %q and %q)", t.Id, other, t.Name)
		}
		names[t.Id] = t.Name
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
func WriteJob(ctx context.Context, coord *coordinator.Job, j *phalanxpb.PSJob) error {
	if _, err := SpecOf(j); err != nil {
		return err
	}
	return coord.WritePSJob(ctx, j)
}

// ReadJob waits until the job's configuration is recorded and returns it,
// once it checks (SpecOf): another record at the key may decode as a job.
func ReadJob(ctx context.Context, coord *coordinator.Job) (*phalanxpb.PSJob, error) {
	j, err := coord.ReadPSJob(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := SpecOf(j); err != nil {
		return nil, fmt.Errorf("cluster: %s is not a valid parameter-server job: %w", coord.Keys().PSJob(), err)
	}
	return j, nil
}

// NodeConfig configures a parameter server process.
type NodeConfig struct {
	ID     string // unique per process
	Listen string // the data plane's address (127.0.0.1:0 picks a port)
	// Advertise is the address clients dial when it is not Listen's (a
	// host alone takes the bound port); a Listen of every interface needs
	// one.
	Advertise string
	LeaseTTL  time.Duration
	Logger    *zap.Logger
	// TLS and DialTLS are the job's mutual TLS (ps.ServerConfig): the
	// data plane's listener and the dialer of the shards' backups.
	TLS, DialTLS *tls.Config
	// OnReady, when set, is told the data-plane address once registered.
	OnReady func(addr string)
}

// Serve runs a parameter server for the job until ctx ends, its lease is
// lost, or a shard actor fails beyond its restart budget.
func Serve(ctx context.Context, coord *coordinator.Job, cfg NodeConfig) error {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	job, err := ReadJob(ctx, coord)
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
	srv, err := ps.Listen(ps.ServerConfig{Addr: cfg.Listen, Advertise: cfg.Advertise, Tables: spec.Tables, Sync: spec.Sync, System: sys, Logger: log,
		TLS: cfg.TLS, DialTLS: cfg.DialTLS})
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
	var lease *coordinator.Lease
	err = coordinator.Retry(ctx, registerRetryBudget, func(err error) {
		log.Warn("registering: etcd unavailable; retrying", zap.Error(err))
	}, func(ctx context.Context) (err error) {
		lease, err = coordinator.RegisterAt(ctx, coord.Client(), coord.Keys().PSServer(cfg.ID), &phalanxpb.PSServer{Id: cfg.ID, Addr: srv.Addr(), Pid: int64(os.Getpid()), Host: host}, cfg.LeaseTTL)
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		// Stop serving first: a worker must not reach this server as a
		// primary once the next map (written when the registration goes)
		// has promoted a backup.
		srv.Close()
		// etcd may be unreachable: the lease then expires by itself.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), revokeTimeout(cfg.LeaseTTL))
		defer cancel()
		if err := lease.Close(rctx); err != nil {
			log.Warn("revoking the registration's lease: it goes when the lease expires", zap.Error(err))
		}
	}()
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
	maps := make(chan *phalanxpb.ShardMap, 1) // the newest map not yet taken; closed when the watch ends
	watched := make(chan error, 1)
	go func() {
		defer close(maps)
		watched <- coord.WatchShardMap(mctx, func(m *phalanxpb.ShardMap) bool {
			select { // this is the only sender: after the drain the send cannot block
			case <-maps:
			default:
			}
			maps <- m
			return true
		})
	}()
	takeRoles(mctx, maps, func(ctx context.Context, m *phalanxpb.ShardMap) error { return apply(ctx, srv, cfg.ID, m) },
		retryAfter, log)
	cancel()
	err = <-watched
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

// revokeTimeout bounds the revoke of a lease of ttl at shutdown: no longer
// than the lease would live anyway, nor than a few seconds.
func revokeTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl, time.Second), 5*time.Second)
}

// Directory is a ps.Directory that follows the job's shard map in etcd.
type Directory struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced with each new map
	m       *phalanxpb.ShardMap
	shards  map[uint32]*phalanxpb.ShardPlacement // by shard: a map need not list them in order
	addr    map[string]string                    // by server id
	err     error
}

// NewDirectory follows the shard map until ctx ends; it waits for the
// first, and fails when following fails before it.
func NewDirectory(ctx context.Context, coord *coordinator.Job) (*Directory, error) {
	d := &Directory{changed: make(chan struct{})}
	first := make(chan struct{})
	ended := make(chan struct{}) // d.err is set
	go func() {
		err := coord.WatchShardMap(ctx, func(m *phalanxpb.ShardMap) bool {
			d.set(m)
			select {
			case <-first:
			default:
				close(first)
			}
			return true
		})
		err = cmpErr(err, ctx.Err())
		select {
		case <-first:
			err = fmt.Errorf("cluster: the shard map is no longer followed: %w", err)
		default:
			err = fmt.Errorf("cluster: following the shard map: %w", err)
		}
		d.mu.Lock()
		d.err = err
		close(d.changed)
		d.changed = make(chan struct{})
		d.mu.Unlock()
		close(ended)
	}()
	select {
	case <-first:
		return d, nil
	case <-ended:
		select {
		case <-first: // a map came before the end: the directory answers with d.err
			return d, nil
		default:
		}
		return nil, d.err
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
	d.shards = map[uint32]*phalanxpb.ShardPlacement{}
	for _, p := range m.Shards {
		d.shards[p.Shard] = p
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
	var p *phalanxpb.ShardPlacement
	if shard >= 0 && int64(shard) <= math.MaxUint32 {
		p = d.shards[uint32(shard)]
	}
	if p == nil {
		return "", d.m.Generation, fmt.Errorf("cluster: no shard %d in a map of %d", shard, len(d.m.Shards))
	}
	a, ok := d.addr[p.Primary]
	if !ok {
		return "", d.m.Generation, fmt.Errorf("cluster: shard %d's primary %s has no address", shard, p.Primary)
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
