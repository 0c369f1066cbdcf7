package elastic

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

var endpoints []string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "phalanx-etcd-")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: dir})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	endpoints = e.Endpoints()
	code := m.Run()
	e.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// jobKeys gives each test run its own job, so that -count=N reruns start
// from nothing.
func jobKeys(t *testing.T) coordinator.Keys {
	t.Helper()
	keys, err := coordinator.KeysFor(fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// counterJob is a toy training job: every step allreduces a one and checks
// the sum is the world size; the step count is the state, resynced by max.
type counterJob struct {
	target  int
	mu      sync.Mutex
	steps   map[string]int
	worlds  map[int]bool
	reached chan string // an agent's id, each time one passes a step
}

func (j *counterJob) targetNow() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.target
}

func (j *counterJob) body(id string) Body {
	return func(ctx context.Context, r *Round) error {
		j.mu.Lock()
		st := []float64{float64(j.steps[id])}
		j.worlds[r.Group.Size()] = true
		j.mu.Unlock()
		if err := r.Group.AllReduce(ctx, collective.Float64s(st), collective.Max); err != nil {
			return err
		}
		step := int(st[0])
		one := []float32{1}
		for step < j.targetNow() {
			one[0] = 1
			if err := r.Group.AllReduce(ctx, collective.Float32s(one), collective.Sum); err != nil {
				return err
			}
			if int(one[0]) != r.Group.Size() {
				return fmt.Errorf("step %d: sum %v in a world of %d", step, one[0], r.Group.Size())
			}
			step++
			j.mu.Lock()
			j.steps[id] = step
			j.mu.Unlock()
			select {
			case j.reached <- id:
			default:
			}
		}
		return r.Group.Barrier(ctx)
	}
}

type runner struct {
	cancel context.CancelFunc
	done   chan error
}

func startAgent(t *testing.T, ctx context.Context, keys coordinator.Keys, id string, j *counterJob) *runner {
	t.Helper()
	tr, err := collective.ListenTCP(collective.TCPOptions{Bind: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(Config{Coord: coordinator.NewJob(client(t), keys), Job: "counter", Transport: tr, DataAddr: tr.Addr(), ControlAddr: tr.Addr(),
		// A lease a loaded machine cannot lose by a pause; no test waits for
		// one to expire (a stopped agent's lease is revoked as it returns).
		RankHint: -1, LeaseTTL: 10 * time.Second, ID: id, ConfigHash: "cfg-1",
		Collective: collective.Options{Timeout: 20 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(actx, j.body(id)); tr.Close() }()
	return r
}

func startCoordinator(t *testing.T, ctx context.Context, keys coordinator.Keys, min, max int, onGen func(*phalanxpb.Generation)) {
	t.Helper()
	c, err := coordinator.New(coordinator.NewJob(client(t), keys), coordinator.Config{ID: "c1", Rendezvous: coordinator.Rendezvous{MinWorkers: min, MaxWorkers: max},
		JoinWindow: 50 * time.Millisecond, OnDecision: onGen})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.Run(cctx) }()
	t.Cleanup(func() {
		cancel()
		awaitCoordinator(t, done)
	})
}

// awaitCoordinator waits for a cancelled coordinator's Run to return, and
// fails the test with the coordinator's goroutines if it has not within 30s
// (seen once, under a load average of 12, in TestEtcdUnreachable; a cancelled
// coordinator returns within microseconds otherwise).
func awaitCoordinator(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		buf := make([]byte, 8<<20)
		var stuck []string
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "phalanx/coordinator") {
				stuck = append(stuck, g)
			}
		}
		t.Errorf("the coordinator did not return within 30s of its cancellation; its goroutines:\n%s", strings.Join(stuck, "\n\n"))
	}
}

// waitFor waits until agent who ("" any) has passed step, and fails the
// test, naming what it waited for and where each agent stands, if ctx ends
// first.
func waitFor(ctx context.Context, t *testing.T, ch <-chan string, who string, j *counterJob, step int) {
	t.Helper()
	for {
		select {
		case id := <-ch:
			j.mu.Lock()
			s := j.steps[id]
			j.mu.Unlock()
			if (who == "" || id == who) && s >= step {
				return
			}
		case <-ctx.Done():
			j.mu.Lock()
			defer j.mu.Unlock()
			t.Fatalf("waited for agent %q to pass step %d: %v; steps passed: %v", who, step, context.Cause(ctx), j.steps)
		}
	}
}

// result is an agent's Run's error, or a test failure naming the agent if
// ctx ends first.
func result(ctx context.Context, t *testing.T, who string, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		t.Fatalf("waited for agent %s to return: %v", who, context.Cause(ctx))
		return nil
	}
}

// TestAgentsCloseRanks: three agents train; one leaves mid-run, the other two
// rebuild the ring and go on; a fourth joins; all finish the job in their
// first processes.
func TestAgentsCloseRanks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	keys := jobKeys(t)
	var gens []*phalanxpb.Generation
	var gmu sync.Mutex
	startCoordinator(t, ctx, keys, 2, 4, func(g *phalanxpb.Generation) { gmu.Lock(); gens = append(gens, g); gmu.Unlock() })
	// The job's end is set once d trains: a fixed one could be reached by a
	// and b before d is admitted.
	j := &counterJob{target: math.MaxInt, steps: map[string]int{}, worlds: map[int]bool{}, reached: make(chan string, 1)}
	a := startAgent(t, ctx, keys, "a", j)
	b := startAgent(t, ctx, keys, "b", j)
	c := startAgent(t, ctx, keys, "c", j)
	waitFor(ctx, t, j.reached, "", j, 300)
	c.cancel()
	if err := result(ctx, t, "c", c.done); !errors.Is(err, context.Canceled) {
		t.Fatalf("the stopped agent returned %v", err)
	}
	j.mu.Lock()
	left := j.steps["c"]
	j.mu.Unlock()
	waitFor(ctx, t, j.reached, "a", j, left+100)
	d := startAgent(t, ctx, keys, "d", j)
	waitFor(ctx, t, j.reached, "d", j, 1)
	j.mu.Lock()
	j.target = j.steps["d"] + 500
	j.mu.Unlock()
	for name, r := range map[string]*runner{"a": a, "b": b, "d": d} {
		if err := result(ctx, t, name, r.done); err != nil {
			t.Fatalf("agent %s: %v", name, err)
		}
	}
	gmu.Lock()
	defer gmu.Unlock()
	for _, g := range gens {
		t.Logf("generation %d: %d members: %s", g.Number, len(g.Members), g.Reason)
	}
	last := gens[len(gens)-1]
	if len(last.Members) != 3 || last.Members[2].Id != "d" || !j.worlds[2] || !j.worlds[3] {
		t.Fatalf("generations ended with %v; worlds seen %v", last, j.worlds)
	}
	for _, g := range gens {
		for _, l := range g.Lost {
			if l.Id != "c" {
				t.Errorf("generation %d lost %s", g.Number, l.Id)
			}
		}
	}
}

// TestConfigMismatchRefused: a worker with other training flags is refused
// before it registers, by a message naming both configurations.
func TestConfigMismatchRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := jobKeys(t)
	cli := client(t)
	if _, err := cli.Put(ctx, keys.Config(), "cfg-other"); err != nil {
		t.Fatal(err)
	}
	j := &counterJob{target: 1, steps: map[string]int{}, worlds: map[int]bool{}, reached: make(chan string, 1)}
	r := startAgent(t, ctx, keys, "x", j)
	err := result(ctx, t, "x", r.done)
	var me *ConfigMismatchError
	if !errors.As(err, &me) || me.Ours != "cfg-1" || me.Theirs != "cfg-other" {
		t.Fatalf("got %v, want a configuration mismatch", err)
	}
	if resp, _ := cli.Get(ctx, keys.Workers(), clientv3.WithPrefix()); len(resp.Kvs) != 0 {
		t.Errorf("the refused worker registered")
	}
}

// TestEtcdUnreachable: with etcd gone, the ring keeps training (membership
// is unchanged), and each worker fails with ErrUnreachable once its lease
// cannot be renewed for longer than the bound. The lease (5 s) is lost
// about 5 s after etcd goes, the bound (6 s) runs from there: a loaded
// machine has ample time for the 1000 steps that show training goes on,
// and no pause of it loses the lease while etcd is up.
func TestEtcdUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	keys := jobKeys(t)
	c, err := coordinator.New(coordinator.NewJob(cli, keys), coordinator.Config{ID: "c", Rendezvous: coordinator.Rendezvous{MinWorkers: 2, MaxWorkers: 2}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(ctx)
	cdone := make(chan struct{})
	go func() { defer close(cdone); c.Run(cctx) }()
	defer func() {
		stop()
		awaitCoordinator(t, cdone)
	}()
	j := &counterJob{target: 1 << 40, steps: map[string]int{}, worlds: map[int]bool{}, reached: make(chan string, 1)}
	var runs []chan error
	for _, id := range []string{"u1", "u2"} {
		tr, err := collective.ListenTCP(collective.TCPOptions{Bind: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		wcli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer wcli.Close()
		a, err := New(Config{Coord: coordinator.NewJob(wcli, keys), Job: "unreachable", Transport: tr, DataAddr: tr.Addr(), ControlAddr: tr.Addr(),
			RankHint: -1, LeaseTTL: 5 * time.Second, Unreachable: 6 * time.Second, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx, j.body(id)); tr.Close() }()
		runs = append(runs, done)
	}
	waitFor(ctx, t, j.reached, "u1", j, 100)
	e.Close()
	closed = true
	j.mu.Lock()
	at := j.steps["u1"]
	j.mu.Unlock()
	waitFor(ctx, t, j.reached, "u1", j, at+1000) // training goes on without etcd
	for i, done := range runs {
		if err := result(ctx, t, fmt.Sprintf("u%d", i+1), done); !errors.Is(err, ErrUnreachable) {
			t.Fatalf("a worker without etcd returned %v, want ErrUnreachable", err)
		}
	}
}
