package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/ps"
)

type psBenchResult struct {
	Op        string  `json:"op"`
	Workers   int     `json:"workers"`
	Shards    int     `json:"shards"`
	Replicas  int     `json:"replicas"`
	Keys      int     `json:"keys_per_request"`
	Dim       int     `json:"dim"`
	RowBytes  int64   `json:"row_bytes"`
	Seconds   float64 `json:"seconds"`
	GBps      float64 `json:"GBps"`
	RawGBps   float64 `json:"raw_tcp_GBps"`
	Ratio     float64 `json:"ratio"`
	Requests  int64   `json:"requests"`
	MedianReq float64 `json:"median_pushpull_ms"`
}

// benchPS measures sparse push+pull throughput against raw loopback TCP
// measured in the same run.
func benchPS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench ps",
		"Measures the parameter server's sparse push+pull throughput (bytes of row data moved per second):\n"+
			"workers pull then push random distinct keys of a 64-dim table split over shards, each hosted by a\n"+
			"server on 127.0.0.1, and compares it with one raw loopback TCP stream measured in the same run.", stderr)
	workers := fs.Int("workers", 2, "worker clients")
	shards := fs.Int("shards", 2, "shards, one server each")
	replicas := fs.Int("replicas", 0, "backups of each shard")
	keys := fs.Int("keys", 4096, "keys per request")
	dim := fs.Int("dim", 64, "floats per row")
	space := fs.Int("key-space", 1_000_000, "keys are drawn from 0..key-space-1")
	dur := fs.Duration("duration", 5*time.Second, "how long to measure each")
	jsonOut := fs.Bool("json", false, "print one JSON object and nothing else")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch {
	case *workers < 1 || *shards < 1 || *replicas < 0 || *replicas >= *shards:
		return usagef("--workers and --shards must be positive, --replicas below --shards")
	case *keys < 1 || *keys > *space || *dim < 1 || *dim > ps.MaxDim:
		return usagef("--keys must be in 1..--key-space, --dim in 1..%d", ps.MaxDim)
	case *dur <= 0:
		return usagef("--duration must be positive")
	}
	raw, err := rawTCP(ctx, *dur, 4<<20)
	if err != nil {
		return err
	}
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		return err
	}
	defer sys.Shutdown()
	table := ps.TableSpec{ID: 1, Name: "emb", Dim: *dim, KeySpace: uint64(*space), Init: ps.InitUniform, InitScale: 0.01, Optimizer: ps.SGD, LR: 0.01}
	syncSpec := ps.SyncSpec{Mode: ps.ASP, Workers: *workers}
	servers := make([]*ps.Server, *shards)
	dir := make(ps.StaticDirectory, *shards)
	for i := range servers {
		s, err := ps.Listen(ps.ServerConfig{Addr: "127.0.0.1:0", Tables: []ps.TableSpec{table}, Sync: syncSpec, System: sys})
		if err != nil {
			return err
		}
		defer s.Close()
		servers[i], dir[i] = s, s.Addr()
	}
	for sh := range *shards {
		for i, s := range servers {
			if i == sh || (i-sh+*shards)%*shards <= *replicas {
				if err := s.Host(ctx, uint32(sh)); err != nil {
					return err
				}
			}
		}
	}
	for sh := range *shards {
		var backups []string
		for r := 1; r <= *replicas; r++ {
			backups = append(backups, servers[(sh+r)%*shards].Addr())
		}
		if err := servers[sh].SetRole(ctx, uint32(sh), true, backups, 1); err != nil {
			return err
		}
	}
	type tally struct {
		bytes, reqs int64
		lat         []time.Duration
		err         error
	}
	tallies := make([]tally, *workers)
	var wg, ready sync.WaitGroup
	go_ := make(chan struct{})
	var start, deadline time.Time
	for w := range *workers {
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tl := &tallies[w]
			cl, err := ps.NewClient(ps.ClientConfig{Worker: w, Tables: []ps.TableSpec{table}, Partition: ps.PartitionHash, Shards: *shards, Sync: syncSpec, Directory: dir})
			if err != nil {
				tl.err = err
				ready.Done()
				return
			}
			defer cl.Close()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			sets := make([][]uint64, 16) // drawn before the clock starts
			seen := make(map[uint64]bool, *keys)
			for i := range sets {
				clear(seen)
				for len(sets[i]) < *keys {
					if x := rng.Uint64N(uint64(*space)); !seen[x] {
						seen[x] = true
						sets[i] = append(sets[i], x)
					}
				}
			}
			vals := make([]float32, *keys**dim)
			grads := make([]float32, *keys**dim)
			for i := range grads {
				grads[i] = rng.Float32() - 0.5
			}
			ready.Done()
			<-go_
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				k := sets[n%len(sets)]
				t0 := time.Now()
				if err := cl.Pull(ctx, 1, k, vals); err != nil {
					tl.err = err
					return
				}
				if _, err := cl.Push(ctx, 1, k, grads); err != nil {
					tl.err = err
					return
				}
				tl.lat = append(tl.lat, time.Since(t0))
				tl.bytes += 2 * int64(len(vals)) * 4
				tl.reqs++
			}
		}()
	}
	ready.Wait()
	start = time.Now()
	deadline = start.Add(*dur)
	close(go_)
	wg.Wait()
	secs := time.Since(start).Seconds()
	r := psBenchResult{Op: "ps", Workers: *workers, Shards: *shards, Replicas: *replicas, Keys: *keys, Dim: *dim, Seconds: secs, RawGBps: raw.GBps}
	var lat []float64
	for _, tl := range tallies {
		if tl.err != nil {
			return tl.err
		}
		r.RowBytes += tl.bytes
		r.Requests += tl.reqs
		for _, d := range tl.lat {
			lat = append(lat, d.Seconds())
		}
	}
	r.GBps = float64(r.RowBytes) / secs / 1e9
	r.Ratio = r.GBps / raw.GBps
	if len(lat) > 0 {
		r.MedianReq = median(lat) * 1e3
	}
	if *jsonOut {
		return json.NewEncoder(stdout).Encode(r)
	}
	fmt.Fprintf(stdout, "| measure | GB/s | vs raw TCP |\n|---|---|---|\n")
	fmt.Fprintf(stdout, "| raw loopback TCP, one stream | %.3f | 1.00 |\n", raw.GBps)
	fmt.Fprintf(stdout, "| ps push+pull, %d workers × %d shards (replicas %d), %d keys × %d floats | %.3f | **%.2f** (target ≥ 0.40) |\n",
		*workers, *shards, *replicas, *keys, *dim, r.GBps, r.Ratio)
	fmt.Fprintf(stdout, "# %d push+pull pairs, median %.2f ms each\n", r.Requests, r.MedianReq)
	return nil
}
