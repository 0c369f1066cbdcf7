package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/ps"
)

// PSConfig is what the parameter-server benchmark measures: Workers clients
// pulling then pushing Keys random distinct keys of a Dim-wide table split
// over Shards, each primary on its own server on 127.0.0.1 with Replicas
// backups on the next servers.
type PSConfig struct {
	Workers  int
	Shards   int
	Replicas int // backups of each shard, below Shards
	Keys     int // keys per request
	Dim      int // floats per row
	KeySpace int // keys are drawn from 0..KeySpace-1
	Duration time.Duration
}

// PSResult is the parameter server's figures; its JSON form is the line of
// `phalanx bench ps --json`.
type PSResult struct {
	Op        string  `json:"op"` // "ps"
	Workers   int     `json:"workers"`
	Shards    int     `json:"shards"`
	Replicas  int     `json:"replicas"`
	Keys      int     `json:"keys_per_request"`
	Dim       int     `json:"dim"`
	RowBytes  int64   `json:"row_bytes"` // row data pulled and pushed
	Seconds   float64 `json:"seconds"`
	GBps      float64 `json:"GBps"`
	RawGBps   float64 `json:"raw_tcp_GBps"` // LoopbackTCP in the same run
	Ratio     float64 `json:"ratio"`        // GBps / RawGBps
	Requests  int64   `json:"requests"`     // push+pull pairs
	MedianReq float64 `json:"median_pushpull_ms"`
}

func (c PSConfig) validate() error {
	switch {
	case c.Workers < 1 || c.Shards < 1 || c.Replicas < 0 || c.Replicas >= c.Shards:
		return fmt.Errorf("bench: ps: %d workers, %d shards, %d replicas: want positive workers and shards, replicas below shards",
			c.Workers, c.Shards, c.Replicas)
	case c.Keys < 1 || c.Keys > c.KeySpace || c.Dim < 1 || c.Dim > ps.MaxDim:
		return fmt.Errorf("bench: ps: %d keys of %d, dim %d: want keys in 1..key space, dim in 1..%d", c.Keys, c.KeySpace, c.Dim, ps.MaxDim)
	case c.Duration <= 0:
		return fmt.Errorf("bench: ps: duration %v, want positive", c.Duration)
	}
	return nil
}

// PS measures sparse push+pull throughput (bytes of row data moved per
// second) against one raw loopback TCP stream measured in the same run.
func PS(ctx context.Context, cfg PSConfig) (PSResult, error) {
	if err := cfg.validate(); err != nil {
		return PSResult{}, err
	}
	raw, err := LoopbackTCP(ctx, TCPConfig{Duration: cfg.Duration, WriteBytes: 4 << 20})
	if err != nil {
		return PSResult{}, err
	}
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		return PSResult{}, fmt.Errorf("bench: ps: %w", err)
	}
	defer sys.Shutdown()
	table := ps.TableSpec{ID: 1, Name: "emb", Dim: cfg.Dim, KeySpace: uint64(cfg.KeySpace), Init: ps.InitUniform, InitScale: 0.01, Optimizer: ps.SGD, LR: 0.01}
	syncSpec := ps.SyncSpec{Mode: ps.ASP, Workers: cfg.Workers}
	dir, closeServers, err := startShards(ctx, sys, cfg, table, syncSpec)
	defer closeServers()
	if err != nil {
		return PSResult{}, fmt.Errorf("bench: ps: %w", err)
	}
	loads := make([]*psLoad, cfg.Workers)
	for w := range loads {
		cl, err := ps.NewClient(ps.ClientConfig{Worker: w, Tables: []ps.TableSpec{table}, Partition: ps.PartitionHash,
			Shards: cfg.Shards, Sync: syncSpec, Directory: dir})
		if err != nil {
			return PSResult{}, fmt.Errorf("bench: ps: worker %d: %w", w, err)
		}
		defer cl.Close()
		loads[w] = newPSLoad(cl, cfg, w)
	}
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	errs := make([]error, len(loads))
	var wg sync.WaitGroup
	for w, l := range loads {
		wg.Add(1)
		go func() { defer wg.Done(); errs[w] = l.run(ctx, deadline) }()
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return PSResult{}, fmt.Errorf("bench: ps: %w", err)
	}
	r := PSResult{Op: "ps", Workers: cfg.Workers, Shards: cfg.Shards, Replicas: cfg.Replicas, Keys: cfg.Keys, Dim: cfg.Dim,
		Seconds: secs, RawGBps: raw.GBps}
	var lat []float64
	for _, l := range loads {
		r.RowBytes += l.bytes
		r.Requests += l.reqs
		lat = append(lat, l.lat...)
	}
	r.GBps = float64(r.RowBytes) / secs / 1e9
	r.Ratio = r.GBps / raw.GBps
	r.MedianReq = median(lat) * 1e3
	return r, nil
}

// WritePS runs PS and prints its figures as `phalanx bench ps` does.
func WritePS(ctx context.Context, cfg PSConfig, out Output) error {
	r, err := PS(ctx, cfg)
	if err != nil {
		return err
	}
	if out.JSON {
		return json.NewEncoder(out.W).Encode(r)
	}
	fmt.Fprintf(out.W, "| measure | GB/s | vs raw TCP |\n|---|---|---|\n")
	fmt.Fprintf(out.W, "| raw loopback TCP, one stream | %.3f | 1.00 |\n", r.RawGBps)
	fmt.Fprintf(out.W, "| ps push+pull, %d workers × %d shards (replicas %d), %d keys × %d floats | %.3f | **%.2f** (target ≥ 0.40) |\n",
		r.Workers, r.Shards, r.Replicas, r.Keys, r.Dim, r.GBps, r.Ratio)
	_, err = fmt.Fprintf(out.W, "# %d push+pull pairs, median %.2f ms each\n", r.Requests, r.MedianReq)
	return err
}

// startShards starts one server per shard, each hosting its shard as primary
// and the Replicas shards before it as backup. closeAll is never nil.
func startShards(ctx context.Context, sys *actors.System, cfg PSConfig, table ps.TableSpec, syncSpec ps.SyncSpec) (dir ps.StaticDirectory, closeAll func(), err error) {
	var servers []*ps.Server
	closeAll = func() {
		for _, s := range servers {
			s.Close()
		}
	}
	for range cfg.Shards {
		s, err := ps.Listen(ps.ServerConfig{Addr: "127.0.0.1:0", Tables: []ps.TableSpec{table}, Sync: syncSpec, System: sys})
		if err != nil {
			return nil, closeAll, err
		}
		servers, dir = append(servers, s), append(dir, s.Addr())
	}
	for sh := range cfg.Shards {
		for i, s := range servers {
			if i == sh || (i-sh+cfg.Shards)%cfg.Shards <= cfg.Replicas {
				if err := s.Host(ctx, uint32(sh)); err != nil {
					return nil, closeAll, fmt.Errorf("server %d hosting shard %d: %w", i, sh, err)
				}
			}
		}
	}
	for sh := range cfg.Shards {
		var backups []string
		for r := 1; r <= cfg.Replicas; r++ {
			backups = append(backups, servers[(sh+r)%cfg.Shards].Addr())
		}
		if err := servers[sh].SetRole(ctx, uint32(sh), true, backups, 1); err != nil {
			return nil, closeAll, fmt.Errorf("shard %d primary: %w", sh, err)
		}
	}
	return dir, closeAll, nil
}

// psLoad is one worker's requests and tally.
type psLoad struct {
	cl          *ps.Client
	worker      int
	sets        [][]uint64 // key sets, drawn before the clock starts
	vals, grads []float32
	bytes, reqs int64
	lat         []float64 // seconds per push+pull pair
}

func newPSLoad(cl *ps.Client, cfg PSConfig, worker int) *psLoad {
	rng := rand.New(rand.NewPCG(uint64(worker), 7))
	l := &psLoad{cl: cl, worker: worker, sets: make([][]uint64, 16),
		vals: make([]float32, cfg.Keys*cfg.Dim), grads: make([]float32, cfg.Keys*cfg.Dim)}
	seen := make(map[uint64]bool, cfg.Keys)
	for i := range l.sets {
		clear(seen)
		for len(l.sets[i]) < cfg.Keys {
			if x := rng.Uint64N(uint64(cfg.KeySpace)); !seen[x] {
				seen[x] = true
				l.sets[i] = append(l.sets[i], x)
			}
		}
	}
	for i := range l.grads {
		l.grads[i] = rng.Float32() - 0.5
	}
	return l
}

// run pulls then pushes one key set after the other until deadline.
func (l *psLoad) run(ctx context.Context, deadline time.Time) error {
	for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
		k := l.sets[n%len(l.sets)]
		t0 := time.Now()
		if err := l.cl.Pull(ctx, 1, k, l.vals); err != nil {
			return fmt.Errorf("worker %d pull: %w", l.worker, err)
		}
		if _, err := l.cl.Push(ctx, 1, k, l.grads); err != nil {
			return fmt.Errorf("worker %d push: %w", l.worker, err)
		}
		l.lat = append(l.lat, time.Since(t0).Seconds())
		l.bytes += 2 * int64(len(l.vals)) * 4
		l.reqs++
	}
	return ctx.Err()
}
