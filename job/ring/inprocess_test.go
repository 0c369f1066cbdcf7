package ring

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/internal/testmodel"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// The tests here run ring workers in this process (RunWorker, each on a
// goroutine of its own) under a coordinator in this process, over an
// embedded etcd and the TCP loopback data plane.

// inProcessLimit bounds an in-process job: generous for a loaded machine,
// short of go test's own timeout.
const inProcessLimit = 3 * time.Minute

// skipInProcessWorkersUnderRace: several workers in one process race in
// protoactor's remote.Start (grpclog.SetLoggerV2), as the root package's
// test of the same name says; such a test runs without -race.
func skipInProcessWorkersUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("several workers in one process race in protoactor's remote.Start (grpclog.SetLoggerV2); run without -race")
	}
}

// features are the regression's inputs.
const features = 4

// regressionTask is a worker's task: its own model, the job's data.
func regressionTask(seed uint64) (job.Task, *testmodel.Regression) {
	m := testmodel.NewRegression(features)
	return job.Task{Model: m, Train: testmodel.NewRows(2000, features, seed), Test: testmodel.NewRows(200, features, seed+1)}, m
}

// cluster is a job's etcd (embedded) and coordinator, in this process; it
// records every generation the coordinator decides.
type cluster struct {
	job       string
	endpoints []string
	gens      chan *phalanxpb.Generation // every decision, in order (buffered)
	mu        sync.Mutex
	decided   []*phalanxpb.Generation
}

// startCluster starts job's etcd and a coordinator whose first ring waits
// for workers workers; both end when the test does.
func startCluster(t *testing.T, ctx context.Context, jobName string, workers, minWorkers int) *cluster {
	t.Helper()
	e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: t.TempDir(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := coordinator.Dial(ctx, e.Endpoints(), coordinator.DialOptions{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	keys, err := coordinator.KeysFor(jobName)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{job: jobName, endpoints: e.Endpoints(), gens: make(chan *phalanxpb.Generation, 256)}
	co, err := coordinator.New(coordinator.NewJob(cli, keys), coordinator.Config{ID: "test-coordinator",
		Rendezvous: coordinator.Rendezvous{MinWorkers: minWorkers, MaxWorkers: workers}, JoinWindow: 20 * time.Millisecond,
		MinWorkersTimeout: time.Minute, FirstRing: workers, FirstRingWait: time.Minute, Logger: zap.NewNop(),
		OnDecision: func(g *phalanxpb.Generation) {
			c.mu.Lock()
			c.decided = append(c.decided, g)
			c.mu.Unlock()
			select {
			case c.gens <- g:
			default: // the test reads what it waits for; the record keeps every one
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- co.Run(cctx) }()
	t.Cleanup(func() { // before the client and etcd close (cleanups run last first)
		cancel()
		testwait.Recv(t, done, time.Minute, "the coordinator to return once cancelled")
	})
	return c
}

// generations are the generations decided so far.
func (c *cluster) generations() []*phalanxpb.Generation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.decided)
}

// awaitGeneration reads decisions until one satisfies pred.
func (c *cluster) awaitGeneration(t *testing.T, what string, pred func(*phalanxpb.Generation) bool) *phalanxpb.Generation {
	t.Helper()
	for {
		if g := testwait.Recv(t, c.gens, inProcessLimit, what); pred(g) {
			return g
		}
	}
}

// workerConfig is worker index's configuration of a small regression job.
func (c *cluster) workerConfig(index int, steps int64) job.Config {
	cfg := job.DefaultConfig()
	cfg.Model, cfg.Job, cfg.Etcd, cfg.Index, cfg.RankHint = "regression", c.job, c.endpoints, index, index
	cfg.Steps, cfg.Batch, cfg.Schedule.Base, cfg.Transport = steps, 64, 0.1, "tcp"
	return cfg
}

// reports collects a worker's reports, safe for its goroutines.
type reports struct {
	mu   sync.Mutex
	all  []job.Report
	reg  chan struct{} // closed at its registration
	once sync.Once
	tell chan<- job.Report // also told of each report, when set (a buffer the test reads)
}

func (r *reports) add(rep job.Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rep)
	if _, ok := rep.(job.Registered); ok {
		close(r.registered())
	}
	if r.tell != nil {
		select {
		case r.tell <- rep:
		default: // the test reads what it waits for; all keeps every one
		}
	}
}

// registered is closed once the worker has registered.
func (r *reports) registered() chan struct{} {
	r.once.Do(func() { r.reg = make(chan struct{}) })
	return r.reg
}

// reportsOf are r's reports of type T so far.
func reportsOf[T job.Report](r *reports) []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []T
	for _, rep := range r.all {
		if t, ok := rep.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// outcome is a worker's end.
type outcome struct {
	res *job.Result
	err error
}

// runWorker runs a worker on a goroutine; its end comes on the channel.
func runWorker(ctx context.Context, cfg job.Config, task job.Task) <-chan outcome {
	done := make(chan outcome, 1)
	go func() {
		res, err := RunWorker(ctx, cfg, task)
		done <- outcome{res, err}
	}()
	return done
}

// finished are the workers' results once each has finished the job; a
// worker's error fails the test.
func finished(t *testing.T, ends []<-chan outcome) []*job.Result {
	t.Helper()
	var results []*job.Result
	for i, end := range ends {
		o := testwait.Recv(t, end, inProcessLimit, fmt.Sprintf("worker %d to finish the job", i))
		if o.err != nil {
			t.Fatalf("worker %d: %v", i, o.err)
		}
		results = append(results, o.res)
	}
	return results
}

// registeredID is the id a worker registered under.
func registeredID(t *testing.T, r *reports) string {
	t.Helper()
	reg := reportsOf[job.Registered](r)
	if len(reg) == 0 {
		t.Fatal("the worker never reported its registration")
	}
	return reg[0].ID
}

// checkSameEnd: every result is of the job's last step on a ring of world,
// with bitwise the same parameters on every rank.
func checkSameEnd(t *testing.T, results []*job.Result, steps int64, world int) {
	t.Helper()
	for i, res := range results {
		if res == nil || res.Step != steps || res.World != world || !res.ParametersIdentical || len(res.RankCRCs) != world {
			t.Fatalf("result %d: %+v; want step %d on a ring of %d, parameters identical", i, res, steps, world)
		}
		if res.ParametersCRC != results[0].ParametersCRC || !slices.Equal(res.RankCRCs, results[0].RankCRCs) {
			t.Fatalf("result %d: parameters CRC %08x (by rank %x), result 0's %08x (%x)", i, res.ParametersCRC, res.RankCRCs,
				results[0].ParametersCRC, results[0].RankCRCs)
		}
	}
}

// holdUntil is an onStep that, from training call at on, holds the step
// until open is closed, failing it if ctx ends first; at is closed once the
// call is reached.
func holdUntil(ctx context.Context, on int, at chan<- struct{}, open <-chan struct{}) func(int) error {
	var once sync.Once
	return func(call int) error {
		if call < on {
			return nil
		}
		once.Do(func() {
			if at != nil {
				close(at)
			}
		})
		select {
		case <-open:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("held at training call %d: %w", call, errors.Join(errors.New("the test never let it go"), context.Cause(ctx)))
		}
	}
}
