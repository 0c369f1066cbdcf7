package cluster

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// rolesHarness drives takeRoles in lockstep: each apply and each back-off
// it asks for waits until the test takes it.
type rolesHarness struct {
	t       *testing.T
	ctx     context.Context // the test's
	cancel  context.CancelFunc
	maps    chan *phalanxpb.ShardMap
	applies chan uint64 // the generation takeRoles applies
	results chan error  // what that apply returns
	retries chan int    // the failures takeRoles backs off after
	timer   chan time.Time
	done    chan struct{}
}

func startTakeRoles(t *testing.T) *rolesHarness {
	ctx := testContext(t)
	h := &rolesHarness{t: t, ctx: ctx, maps: make(chan *phalanxpb.ShardMap), applies: make(chan uint64),
		results: make(chan error), retries: make(chan int), done: make(chan struct{})}
	rctx, cancel := context.WithCancel(ctx)
	h.cancel = cancel
	apply := func(ctx context.Context, m *phalanxpb.ShardMap) error {
		select {
		case h.applies <- m.Generation:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case err := <-h.results:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	retry := func(failures int) <-chan time.Time {
		h.timer = make(chan time.Time, 1) // read by the test once it took failures
		select {
		case h.retries <- failures:
		case <-rctx.Done():
		}
		return h.timer
	}
	go func() {
		defer close(h.done)
		takeRoles(rctx, h.maps, apply, retry, zap.NewNop())
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(30 * time.Second): // h.ctx has ended
			t.Error("takeRoles did not return once its context ended")
		}
	})
	return h
}

// send gives takeRoles the map of generation gen.
func (h *rolesHarness) send(gen uint64) {
	h.t.Helper()
	select {
	case h.maps <- &phalanxpb.ShardMap{Generation: gen}:
	case <-h.ctx.Done():
		h.t.Fatalf("sending generation %d: %v", gen, h.ctx.Err())
	}
}

// apply expects takeRoles to apply generation gen, and makes that return err.
func (h *rolesHarness) apply(gen uint64, err error) {
	h.t.Helper()
	if got := recv(h.t, h.ctx, h.applies, "an apply"); got != gen {
		h.t.Fatalf("takeRoles applied generation %d, want %d", got, gen)
	}
	select {
	case h.results <- err:
	case <-h.ctx.Done():
		h.t.Fatal(h.ctx.Err())
	}
}

// backOff expects takeRoles to back off after its failures-th failure.
func (h *rolesHarness) backOff(failures int) {
	h.t.Helper()
	if got := recv(h.t, h.ctx, h.retries, "a back-off"); got != failures {
		h.t.Fatalf("takeRoles backed off after %d failures, want %d", got, failures)
	}
}

// fire ends the back-off takeRoles last asked for.
func (h *rolesHarness) fire() { h.timer <- time.Time{} }

// end closes the maps and expects takeRoles to return without applying
// any more.
func (h *rolesHarness) end() {
	h.t.Helper()
	close(h.maps)
	select {
	case <-h.done:
	case gen := <-h.applies:
		h.t.Fatalf("takeRoles applied generation %d, want none", gen)
	case <-h.ctx.Done():
		h.t.Fatalf("takeRoles did not return once its maps ended: %v", h.ctx.Err())
	}
}

// TestTakeRoles: a failed apply is retried, backing off, until it succeeds,
// or at once with a newer map; an older map or the same one again is not
// applied, and takeRoles returns when its maps or its context end.
func TestTakeRoles(t *testing.T) {
	refused := errors.New("connection refused")
	for _, tc := range []struct {
		name   string
		script func(h *rolesHarness)
	}{
		{"each newer map once", func(h *rolesHarness) {
			h.send(1)
			h.apply(1, nil)
			h.send(1)
			h.send(3)
			h.apply(3, nil)
			h.send(2)
			h.end()
		}},
		{"retried until it succeeds", func(h *rolesHarness) {
			h.send(1)
			h.apply(1, refused)
			h.backOff(1)
			h.fire()
			h.apply(1, refused)
			h.backOff(2)
			h.send(1) // the same map again does not cut the back-off short
			h.fire()
			h.apply(1, nil)
			// The next failure backs off from the start again.
			h.send(2)
			h.apply(2, refused)
			h.backOff(1)
			h.fire()
			h.apply(2, nil)
			h.end()
		}},
		{"a newer map replaces a failing one", func(h *rolesHarness) {
			h.send(1)
			h.apply(1, refused)
			h.backOff(1)
			h.send(2) // applied at once, back-off or not
			h.apply(2, nil)
			h.fire() // the old back-off ends: nothing is retried
			h.end()
		}},
		{"an older map does not replace a failing one", func(h *rolesHarness) {
			h.send(2)
			h.apply(2, refused)
			h.backOff(1)
			h.send(1)
			h.fire()
			h.apply(2, nil)
			h.end()
		}},
		{"the context ends during a back-off", func(h *rolesHarness) {
			h.send(1)
			h.apply(1, refused)
			h.backOff(1)
			h.cancel()
			recv(h.t, h.ctx, h.done, "takeRoles to return")
		}},
		{"the context ends during an apply", func(h *rolesHarness) {
			h.send(1)
			recv(h.t, h.ctx, h.applies, "an apply")
			h.cancel() // the apply returns the context's error: no back-off
			recv(h.t, h.ctx, h.done, "takeRoles to return")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.script(startTakeRoles(t))
		})
	}
}

func TestRetryDelay(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {6, 3200 * time.Millisecond}, {7, 5 * time.Second}, {1000, 5 * time.Second}} {
		if got := retryDelay(tc.failures); got != tc.want {
			t.Errorf("retryDelay(%d) = %v, want %v", tc.failures, got, tc.want)
		}
	}
}

// loggerTelling is a logger that tells on the channel when msg is logged.
func loggerTelling(msg string) (*zap.Logger, <-chan struct{}) {
	told := make(chan struct{}, 1)
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.DebugLevel)
	return zap.New(zapcore.RegisterHooks(core, func(e zapcore.Entry) error {
		if e.Message == msg {
			select {
			case told <- struct{}{}:
			default:
			}
		}
		return nil
	})), told
}

// TestServeRetriesRoles: a server whose shard's backup refuses its link (the
// backup not serving yet) keeps the map and retries; once the backup serves
// it is the shard's primary, replicating to the backup, which then holds
// the rows pushed when it takes the shard over.
func TestServeRetriesRoles(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	keys := jobKeys(t)
	job := sparseJob("asp")
	if err := WriteJob(ctx, coordinator.NewJob(cli, keys), job); err != nil {
		t.Fatal(err)
	}
	r := &runningJob{keys: keys, spec: specOf(t, job)}
	put := func(m *phalanxpb.ShardMap) {
		t.Helper()
		val, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, keys.ShardMap(), string(val)); err != nil {
			t.Fatal(err)
		}
	}
	// s1's address, refusing connections until s1 listens on it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr1 := ln.Addr().String()
	ln.Close()

	log, retrying := loggerTelling("taking the shard map's roles; retrying")
	s0 := serveNode(t, ctx, cli, keys, NodeConfig{ID: "s0", Listen: "127.0.0.1:0", LeaseTTL: 10 * time.Second, Logger: log})
	stopped := map[string]*routine{"s0": s0}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // ctx may have ended
		defer cancel()
		for id, s := range stopped {
			s.stop()
			s.wait(t, cctx, "server "+id)
		}
	})
	put(&phalanxpb.ShardMap{Generation: 1, Servers: []*phalanxpb.PSServer{{Id: "s0", Addr: s0.addr}, {Id: "s1", Addr: addr1}},
		Shards: []*phalanxpb.ShardPlacement{{Shard: 0, Primary: "s0", Backups: []string{"s1"}}, {Shard: 1, Primary: "s1", Backups: []string{"s0"}}}})
	recv(t, ctx, retrying, "s0's failed link to s1")

	stopped["s1"] = serveNode(t, ctx, cli, keys, NodeConfig{ID: "s1", Listen: addr1, LeaseTTL: 10 * time.Second})
	cl, dir := r.client(t, ctx, cli, 0)
	table := job.Tables[0].Id
	keysOf := []uint64{3, 17, 49, 50, 64, 99} // 3 on each shard
	const lr = float32(0.5)
	want := make([]float32, 2*len(keysOf))
	if err := cl.Pull(ctx, table, keysOf, want); err != nil {
		t.Fatal(err)
	}
	grads := make([]float32, len(want))
	for i := range grads {
		grads[i] = float32(i%5) - 2
		want[i] -= lr * grads[i]
	}
	if _, err := cl.Push(ctx, table, keysOf, grads); err != nil {
		t.Fatal(err)
	}

	// s0 goes; in the next map s1 holds both shards, and shard 0's rows are
	// the ones pushed to s0.
	s0.stop()
	if err := s0.wait(t, ctx, "s0's Serve"); err != nil {
		t.Fatalf("s0 stopped: %v", err)
	}
	put(&phalanxpb.ShardMap{Generation: 2, Servers: []*phalanxpb.PSServer{{Id: "s1", Addr: addr1}},
		Shards: []*phalanxpb.ShardPlacement{{Shard: 0, Primary: "s1"}, {Shard: 1, Primary: "s1"}}})
	if err := dir.Changed(ctx, 1); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(want))
	if err := cl.Pull(ctx, table, keysOf, got); err != nil {
		t.Fatal(err)
	}
	if !near(got, want) {
		t.Fatalf("rows from s1 after s0 went: %v, want %v", got, want)
	}
}
