package coordinator

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// endpoints of the embedded etcd shared by this package's tests; each test
// uses its own job.
var endpoints []string

func TestMain(m *testing.M) {
	if raw, ok := os.LookupEnv(helperEnv); ok { // a coordinator process of a test
		os.Exit(runHelper(raw))
	}
	dir, err := os.MkdirTemp("", "phalanx-etcd-")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	e, err := StartEmbedded(ctx, EmbeddedOptions{Dir: dir})
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

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// jobKeys gives each test run its own job, so a repeated run (-count)
// never sees an earlier run's keys.
func jobKeys(t *testing.T, name string) Keys {
	t.Helper()
	keys, err := KeysFor(jobName(name))
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func jobName(name string) string { return fmt.Sprintf("%s-%d", name, time.Now().UnixNano()) }

// testTTL is the lease and session TTL of these tests: no test waits for
// one to expire (a test that needs a lease gone revokes it, or waits for an
// observable takeover), and a loaded 2-core machine must never lose one
// by a late keep-alive.
const testTTL = 10 * time.Second

func register(t *testing.T, cli *clientv3.Client, keys Keys, id, addr string) *Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := NewJob(cli, keys).Register(ctx, &phalanxpb.Registration{Id: id, DataAddr: addr, ControlAddr: addr, RankHint: -1}, testTTL)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// recv waits for a value from ch, failing the test after d with what it
// waited for.
func recv[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for %s", d, what)
		var zero T
		return zero
	}
}

// runUntilCancelled runs a coordinator until the test ends: its cleanup
// cancels it and waits (bounded) for Run to return.
func runUntilCancelled(t *testing.T, ctx context.Context, c *Coordinator) (stop context.CancelFunc, done <-chan error) {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	ch, finished := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(finished)
		ch <- c.Run(cctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-finished:
		case <-time.After(30 * time.Second):
			t.Errorf("coordinator %s still running 30s after its context was cancelled", c.cfg.ID)
		}
	})
	return cancel, ch
}

// generations watches the job's generation record and delivers each new one.
func generations(t *testing.T, ctx context.Context, cli *clientv3.Client, keys Keys) <-chan *phalanxpb.Generation {
	out := make(chan *phalanxpb.Generation, 16)
	go func() {
		for resp := range cli.Watch(ctx, keys.Generation()) {
			for _, ev := range resp.Events {
				if g, err := DecodeGeneration(keys.Generation(), ev.Kv.Value); err == nil {
					select {
					case out <- g:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return out
}

func next(t *testing.T, ch <-chan *phalanxpb.Generation) *phalanxpb.Generation {
	t.Helper()
	return recv(t, ch, 30*time.Second, "a new generation")
}

func memberIDs(g *phalanxpb.Generation) []string {
	var out []string
	for _, m := range g.Members {
		out = append(out, m.Id)
	}
	return out
}

// listening returns an address that accepts connections until the test ends
// (a live worker), and one that refuses them (a dead one).
func addrs(t *testing.T) (alive, dead string) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	d, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead = d.Addr().String()
	d.Close()
	return l.Addr().String(), dead
}

func start(t *testing.T, ctx context.Context, cli *clientv3.Client, keys Keys, id string, r Rendezvous) context.CancelFunc {
	t.Helper()
	c, err := New(NewJob(cli, keys), Config{ID: id, Rendezvous: r, JoinWindow: time.Millisecond, SessionTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	stop, _ := runUntilCancelled(t, ctx, c)
	return stop
}

// TestMembershipLifecycle: rendezvous, a verified loss report, a refuted
// one, a newcomer, and a clean exit, each giving the generation it should.
func TestMembershipLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "lifecycle")
	gens := generations(t, ctx, cli, keys)
	alive, dead := addrs(t)
	register(t, cli, keys, "a", alive)
	b := register(t, cli, keys, "b", alive)
	register(t, cli, keys, "c", dead) // its process is gone but its lease is not
	start(t, ctx, cli, keys, "coord-a", Rendezvous{MinWorkers: 2, MaxWorkers: 4})
	g := next(t, gens)
	if g.Number != 1 || !slices.Equal(memberIDs(g), []string{"a", "b", "c"}) || g.DecidedBy != "coord-a" {
		t.Fatalf("rendezvous: %v", g)
	}

	// A refuted report (b answers, so it stays) and a verified one (c does
	// not); d, registered after the reports, rides on the rebuilt ring or
	// enters just before or after it (should the coordinator decide d's
	// admission before reading the reports about generation 1, it still
	// probes c, a member of the newer ring).
	if err := NewJob(cli, keys).ReportLoss(ctx, &phalanxpb.LossReport{ReporterId: "a", LostId: "b", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	if err := NewJob(cli, keys).ReportLoss(ctx, &phalanxpb.LossReport{ReporterId: "a", LostId: "c", Generation: 1}); err != nil {
		t.Fatal(err)
	}
	register(t, cli, keys, "d", alive)
	for g = next(t, gens); slices.Contains(memberIDs(g), "c") || !slices.Contains(memberIDs(g), "d"); g = next(t, gens) {
		if !slices.Contains(memberIDs(g), "b") {
			t.Fatalf("b was removed on a refuted report: %v", memberIDs(g))
		}
	}
	if ids := memberIDs(g); slices.Contains(ids, "c") || !slices.Contains(ids, "b") || ids[0] != "a" {
		t.Fatalf("after the reports: %v (%s)", ids, g.Reason)
	}
	last := g.Number

	// A ring broken without a culprit (its members' calls did not match)
	// is rebuilt as it is: the same members, a new generation.
	if err := NewJob(cli, keys).ReportLoss(ctx, &phalanxpb.LossReport{ReporterId: "a", Generation: last, Detail: "mismatched call"}); err != nil {
		t.Fatal(err)
	}
	before := memberIDs(g)
	g = next(t, gens)
	if g.Number != last+1 || !slices.Equal(memberIDs(g), before) {
		t.Fatalf("after a report without a culprit: generation %d %v (%s), want generation %d %v", g.Number, memberIDs(g), g.Reason, last+1, before)
	}
	last = g.Number

	// b leaves cleanly (its lease revoked).
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	g = next(t, gens)
	if g.Number != last+1 || slices.Contains(memberIDs(g), "b") || len(g.Members) != 2 {
		t.Fatalf("after b left: %v (%s)", memberIDs(g), g.Reason)
	}

	// e, which would not answer a probe (a member frozen for a moment),
	// joins; c, removed in generation 2, reports e lost in generation 1: a
	// worker that is no member reports the ring it left, and is not heard.
	// f's admission is the next generation: e is still in it.
	register(t, cli, keys, "e", dead)
	if g = next(t, gens); !slices.Contains(memberIDs(g), "e") {
		t.Fatalf("e not admitted: %v (%s)", memberIDs(g), g.Reason)
	}
	if err := NewJob(cli, keys).ReportLoss(ctx, &phalanxpb.LossReport{ReporterId: "c", LostId: "e", Generation: 1, Detail: "peer lost (rank 2)"}); err != nil {
		t.Fatal(err)
	}
	register(t, cli, keys, "f", alive)
	g = next(t, gens)
	if ids := memberIDs(g); !slices.Contains(ids, "e") || !slices.Contains(ids, "f") {
		t.Fatalf("after a former member's report of an old ring and f's arrival: %v (%s), want e kept and f in", ids, g.Reason)
	}
}

// TestBelowMinimumStops: a job that stays below MinWorkers longer than the
// timeout gets an empty generation saying why.
func TestBelowMinimumStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "below-min")
	gens := generations(t, ctx, cli, keys)
	alive, _ := addrs(t)
	register(t, cli, keys, "a", alive)
	b := register(t, cli, keys, "b", alive)
	c, err := New(NewJob(cli, keys), Config{ID: "c1", Rendezvous: Rendezvous{MinWorkers: 2, MaxWorkers: 2}, MinWorkersTimeout: 50 * time.Millisecond, SessionTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCancelled(t, ctx, c)
	if g := next(t, gens); len(g.Members) != 2 {
		t.Fatalf("rendezvous: %v", g)
	}
	b.Close(ctx)
	g := next(t, gens)
	if len(g.Members) != 0 || g.Number != 2 || !g.Stopped || !strings.Contains(g.Reason, "stopped") || !strings.Contains(g.Reason, "fewer than the minimum of 2") {
		t.Fatalf("got %v (%s), want an empty generation saying the job stopped", memberIDs(g), g.Reason)
	}
}

// TestDoneEndsTheCoordinator: once the done key is written, Run returns
// nil and no generation follows a worker's exit.
func TestDoneEndsTheCoordinator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "done")
	gens := generations(t, ctx, cli, keys)
	alive, _ := addrs(t)
	register(t, cli, keys, "a", alive)
	c, err := New(NewJob(cli, keys), Config{ID: "c1", Rendezvous: Rendezvous{MinWorkers: 1, MaxWorkers: 1}, SessionTTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	_, done := runUntilCancelled(t, ctx, c)
	if g := next(t, gens); len(g.Members) != 1 {
		t.Fatalf("rendezvous: %v", g)
	}
	if _, err := cli.Put(ctx, keys.Done(), "step 10"); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, done, 30*time.Second, "Run to return once the job is done"); err != nil {
		t.Fatalf("Run after done: %v", err)
	}
}

// TestStandbyTakesOver: when the leader dies a standby leads and decides.
// The test stands for the lease's expiry by revoking the dead leader's
// lease itself. A deposed leader that is still alive is
// TestDeposedCoordinatorIsFenced's.
func TestStandbyTakesOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "standby")
	gens := generations(t, ctx, cli, keys)
	alive, _ := addrs(t)
	mk := func(id string) (context.CancelFunc, <-chan error) {
		c, err := New(NewJob(client(t), keys), Config{ID: id, Rendezvous: Rendezvous{MinWorkers: 1, MaxWorkers: 8}, JoinWindow: time.Millisecond, SessionTTL: testTTL})
		if err != nil {
			t.Fatal(err)
		}
		return runUntilCancelled(t, ctx, c)
	}
	stopA, doneA := mk("A")
	register(t, cli, keys, "w1", alive)
	if g := next(t, gens); g.DecidedBy != "A" {
		t.Fatalf("first decision by %q, want A", g.DecidedBy)
	}
	mk("B")
	waitUntil(t, 30*time.Second, "B campaigning behind A", func() (bool, string) {
		kvs := electionKeys(t, ctx, cli, keys.Election())
		return len(kvs) == 2 && string(kvs[0].Value) == "A" && string(kvs[1].Value) == "B", fmt.Sprint(kvs)
	})
	head := electionKeys(t, ctx, cli, keys.Election())[0]
	stopA() // the leader dies
	recv(t, doneA, 30*time.Second, "A's Run to return once cancelled")
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(head.Lease)); err != nil { // its lease, expired
		t.Fatal(err)
	}
	register(t, cli, keys, "w2", alive)
	if g := next(t, gens); g.DecidedBy != "B" || !slices.Equal(memberIDs(g), []string{"w1", "w2"}) {
		t.Fatalf("after A died: %v decided by %q", memberIDs(g), g.DecidedBy)
	}
}

// TestCorruptRecords: a malformed registration is ignored with an error
// logged; a malformed generation record stops the coordinator with an error
// naming the key rather than being overwritten.
func TestCorruptRecords(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "corrupt")
	if _, err := cli.Put(ctx, keys.Worker("junk"), "\xff\xfe not a protobuf"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, keys.Generation(), "\x0a\xff garbage"); err != nil {
		t.Fatal(err)
	}
	c, err := New(NewJob(cli, keys), Config{ID: "x", Rendezvous: Rendezvous{MinWorkers: 1, MaxWorkers: 1}})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), keys.Generation()) {
		t.Fatalf("run: %v, want an error naming %s", err, keys.Generation())
	}
	resp, _ := cli.Get(ctx, keys.Generation())
	if string(resp.Kvs[0].Value) != "\x0a\xff garbage" {
		t.Error("the corrupt record was overwritten")
	}
	if _, err := KeysFor("a/b"); err == nil {
		t.Error("a job name with a slash accepted")
	}
}

// TestExcludeAndReadmit: an exclusion written to etcd gives a generation
// without the straggler; lifting it readmits the worker.
func TestExcludeAndReadmit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "exclude")
	gens := generations(t, ctx, cli, keys)
	alive, _ := addrs(t)
	for _, id := range []string{"a", "b", "c"} {
		register(t, cli, keys, id, alive)
	}
	start(t, ctx, cli, keys, "coord", Rendezvous{MinWorkers: 2, MaxWorkers: 3})
	if g := next(t, gens); len(g.Members) != 3 {
		t.Fatalf("rendezvous: %v", memberIDs(g))
	}
	if err := NewJob(cli, keys).Exclude(ctx, &phalanxpb.Exclusion{Id: "b", Generation: 1, LateIn: 4, Window: 6}); err != nil {
		t.Fatal(err)
	}
	g := next(t, gens)
	if !slices.Equal(memberIDs(g), []string{"a", "c"}) || len(g.Excluded) != 1 || g.Excluded[0].Id != "b" || g.Excluded[0].LateIn != 4 {
		t.Fatalf("after the exclusion: %v excluded %v (%s)", memberIDs(g), g.Excluded, g.Reason)
	}
	if err := NewJob(cli, keys).Readmit(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	g = next(t, gens)
	if !slices.Equal(memberIDs(g), []string{"a", "c", "b"}) || !slices.Equal(g.Readmitted, []string{"b"}) {
		t.Fatalf("after the readmission: %v readmitted %v (%s)", memberIDs(g), g.Readmitted, g.Reason)
	}
}

// TestCorrelatedLoss: when a reported member is found gone, the other
// members are probed at once: one whose process is gone too (a host's
// second worker, not reported yet) is removed in the same generation;
// one that only does not answer in time (frozen) stays, as it would
// unreported.
func TestCorrelatedLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "correlated")
	gens := generations(t, ctx, cli, keys)
	var hostDown atomic.Bool
	probe := func(ctx context.Context, r *phalanxpb.Registration) error {
		switch {
		case r.Id == "e": // frozen: never answers
			<-ctx.Done()
			return ctx.Err()
		case hostDown.Load() && (r.Id == "c" || r.Id == "d"):
			return fmt.Errorf("dial %s: %w", r.DataAddr, syscall.ECONNREFUSED)
		}
		return nil
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		register(t, cli, keys, id, "127.0.0.1:1")
	}
	c, err := New(NewJob(cli, keys), Config{ID: "coord", Rendezvous: Rendezvous{MinWorkers: 1, MaxWorkers: 5}, JoinWindow: time.Millisecond,
		FirstRing: 5, FirstRingWait: 30 * time.Second, SessionTTL: testTTL, Probe: probe, ProbeTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCancelled(t, ctx, c)
	g := next(t, gens)
	if len(g.Members) != 5 {
		t.Fatalf("rendezvous: %v", memberIDs(g))
	}
	hostDown.Store(true)
	if err := NewJob(cli, keys).ReportLoss(ctx, &phalanxpb.LossReport{ReporterId: "a", LostId: "c", Generation: g.Number, Detail: "peer lost"}); err != nil {
		t.Fatal(err)
	}
	g = next(t, gens)
	if ids := memberIDs(g); !slices.Equal(ids, []string{"a", "b", "e"}) {
		t.Fatalf("after c's reported loss with d gone too and e frozen: %v (%s), want [a b e]", ids, g.Reason)
	}
}
