package phalanx_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job/ring"
)

// TestHandStartedFirstRing runs a job as an operator would, by hand: a
// standalone coordinator told how many workers to expect, and three
// workers started one after another, each only once the one before has
// registered. The first ring holds all three: without the count, it formed
// with the first to register and the others joined a generation later.
func TestHandStartedFirstRing(t *testing.T) {
	skipInProcessWorkersUnderRace(t)
	ctx := testwait.Context(t, 3*time.Minute)
	const job, workers = "hand-started", 3
	endpoints := make(chan []string, 1)
	coordDone := make(chan error, 1)
	go func() {
		coordDone <- phalanx.RunCoordinator(ctx, phalanx.CoordinatorConfig{Job: job, JobDir: t.TempDir(), MinWorkers: 1, MaxWorkers: workers,
			Workers: workers, JoinWindow: time.Millisecond, OnEndpoints: func(e []string) { endpoints <- e }})
	}()
	etcd := testwait.Recv(t, endpoints, time.Minute, "the coordinator's embedded etcd to serve")

	var mu sync.Mutex
	var rings []string // generation/world of each ring's rank 0, as it starts
	results := make(chan error, workers)
	for i := range workers {
		registered := make(chan struct{})
		var once sync.Once
		cfg := phalanx.DefaultConfig()
		cfg.Model, cfg.Job, cfg.Etcd, cfg.Index = "regression", job, etcd, i
		cfg.Steps, cfg.Batch, cfg.Schedule.Base = 20, 64, 0.1
		cfg.Reports = func(r phalanx.Report) {
			switch r := r.(type) {
			case phalanx.Registered:
				once.Do(func() { close(registered) })
			case ring.Restored:
				mu.Lock()
				rings = append(rings, fmt.Sprintf("generation %d of %d workers", r.Generation, r.World))
				mu.Unlock()
			}
		}
		go func() {
			_, err := phalanx.RunModel(ctx, cfg, registry())
			results <- err
		}()
		testwait.Recv(t, registered, time.Minute, fmt.Sprintf("worker %d to register", i))
	}
	for range workers {
		if err := testwait.Recv(t, results, 2*time.Minute, "every worker to finish the job"); err != nil {
			t.Fatalf("a worker: %v", err)
		}
	}
	if err := testwait.Recv(t, coordDone, time.Minute, "the coordinator to see the job done"); err != nil {
		t.Fatalf("the coordinator: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rings) != 1 || rings[0] != fmt.Sprintf("generation 1 of %d workers", workers) {
		t.Fatalf("rings %q; want one, the first, of all %d workers", rings, workers)
	}
}

// TestStartWorker: a worker's handle. Ready closes once it trains in a
// ring; Stop makes it leave gracefully (Wait: ErrLeft) while the other
// trains on, until it leaves too.
func TestStartWorker(t *testing.T) {
	skipInProcessWorkersUnderRace(t)
	ctx := testwait.Context(t, 3*time.Minute)
	const job = "handles"
	endpoints := make(chan []string, 1)
	go phalanx.RunCoordinator(ctx, phalanx.CoordinatorConfig{Job: job, JobDir: t.TempDir(), MinWorkers: 1, MaxWorkers: 2,
		Workers: 2, OnEndpoints: func(e []string) { endpoints <- e }})
	etcd := testwait.Recv(t, endpoints, time.Minute, "the coordinator's embedded etcd to serve")
	spec, err := registry().Lookup("regression")
	if err != nil {
		t.Fatal(err)
	}
	var ws []*phalanx.Worker
	for i := range 2 {
		cfg := phalanx.DefaultConfig()
		cfg.Model, cfg.Job, cfg.Etcd, cfg.Index = "regression", job, etcd, i
		cfg.Steps, cfg.Batch, cfg.Schedule.Base = 1000000, 64, 0.1
		task, err := spec.New(phalanx.Options{"features": "4", "nan_at": "0"}, cfg.Seed)
		if err != nil {
			t.Fatal(err)
		}
		w, err := phalanx.StartWorker(ctx, cfg, task)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	for i, w := range ws {
		testwait.Recv(t, w.Ready(), 2*time.Minute, fmt.Sprintf("worker %d to train in a ring", i))
	}
	for i, w := range ws {
		if err := w.Stop(testwait.Context(t, 2*time.Minute)); err != nil {
			t.Fatalf("worker %d: Stop: %v", i, err)
		}
		if res, err := w.Wait(); !errors.Is(err, phalanx.ErrLeft) || res != nil {
			t.Fatalf("worker %d after Stop: %+v, %v; want ErrLeft", i, res, err)
		}
		if i == 0 {
			select {
			case <-ws[1].Done():
				res, err := ws[1].Wait()
				t.Fatalf("worker 1 ended when worker 0 left: %+v, %v", res, err)
			default:
			}
		}
	}
}

// skipInProcessWorkersUnderRace skips a test that runs several workers in
// this process: protoactor's remote.Start replaces the process-wide gRPC
// logger, a race the detector reports (../shared/DEPENDENCIES.md), so such
// a test runs in the full pass, without -race; the job handle's test runs
// its workers as processes, under -race too.
func skipInProcessWorkersUnderRace(t *testing.T) {
	if raceEnabled {
		t.Skip("several workers in one process race in protoactor's remote.Start (grpclog.SetLoggerV2); run without -race")
	}
}
