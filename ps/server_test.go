package ps

import (
	"context"
	"errors"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// cluster is servers on loopback, each hosting every shard, with shard s's
// primary on server s mod n and its backups on the next servers.
type cluster struct {
	t       *testing.T
	sys     *actors.System
	servers []*Server
	tables  []TableSpec
	sync    SyncSpec
	shards  int
	waits   chan waitEvent
	mu      sync.Mutex
	applied []appliedPush
	timers  chan func() // hybrid deadlines, fired by the test
}

type waitEvent struct {
	shard, worker uint32
	clock         int64
}

type appliedPush struct {
	server        int
	shard, worker uint32
	id            uint64
	clock         int64
	act           PushAction
}

func newCluster(t *testing.T, n, shards, replicas int, tables []TableSpec, sync SyncSpec) *cluster {
	t.Helper()
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Shutdown)
	c := &cluster{t: t, sys: sys, tables: tables, sync: sync, shards: shards, waits: make(chan waitEvent, 64), timers: make(chan func(), 64)}
	ctx := testContext(t)
	for i := range n {
		i := i
		s, err := Listen(ServerConfig{Addr: "127.0.0.1:0", Tables: tables, Sync: sync, System: sys,
			Applied: func(shard, table, worker uint32, id uint64, clock int64, act PushAction) {
				c.mu.Lock()
				c.applied = append(c.applied, appliedPush{i, shard, worker, id, clock, act})
				c.mu.Unlock()
			},
			OnWait: func(shard, _, worker uint32, clock int64) { c.waits <- waitEvent{shard, worker, clock} },
			After:  func(_ time.Duration, f func()) { c.timers <- f },
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		c.servers = append(c.servers, s)
		for sh := range shards {
			if err := s.Host(ctx, uint32(sh)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for sh := range shards {
		p := sh % n
		var backups []string
		for r := 1; r <= replicas; r++ {
			backups = append(backups, c.servers[(p+r)%n].Addr())
		}
		if err := c.servers[p].SetRole(ctx, uint32(sh), true, backups, 1); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func (c *cluster) dir() StaticDirectory {
	d := make(StaticDirectory, c.shards)
	for sh := range d {
		d[sh] = c.servers[sh%len(c.servers)].Addr()
	}
	return d
}

func (c *cluster) client(worker int, part Partition) *Client {
	c.t.Helper()
	cl, err := NewClient(ClientConfig{Worker: worker, Tables: c.tables, Partition: part, Shards: c.shards, Sync: c.sync, Directory: c.dir()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// rows reads every row of table held by server i's copy of shard.
func (c *cluster) rows(i int, sh, table uint32) map[uint64][]float32 {
	c.t.Helper()
	v, err := c.servers[i].inspect(testContext(c.t), sh, func(s *shard) any {
		out := map[uint64][]float32{}
		t := s.tables[table]
		d := t.rows.Spec().Dim
		t.rows.Each(func(k uint64, row []float32) { out[k] = slices.Clone(row[:d]) })
		return out
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return v.(map[uint64][]float32)
}

func sgdTable(dim int) TableSpec {
	return TableSpec{ID: 1, Name: "emb", Dim: dim, KeySpace: 1000, Init: InitUniform, InitScale: 0.1, Seed: 5, Optimizer: SGD, LR: 0.5}
}

// initial is what key's row starts as.
func initial(spec TableSpec, k uint64) []float32 {
	spec.Validate()
	row := make([]float32, spec.Dim+spec.stateFloats())
	initRow(&spec, k, row)
	return row[:spec.Dim]
}

func near(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-6 {
			return false
		}
	}
	return true
}

func TestPushPullASP(t *testing.T) {
	spec := sgdTable(2)
	c := newCluster(t, 2, 2, 0, []TableSpec{spec}, SyncSpec{Mode: ASP, Workers: 2})
	ctx := testContext(t)
	w0, w1 := c.client(0, PartitionRange), c.client(1, PartitionRange)
	keys := []uint64{10, 900, 10 + 1} // shard 0, shard 1, shard 0
	out := make([]float32, 6)
	if err := w1.Pull(ctx, 1, keys, out); err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if !near(out[2*i:2*i+2], initial(spec, k)) {
			t.Fatalf("key %d starts at %v, want %v", k, out[2*i:2*i+2], initial(spec, k))
		}
	}
	if _, err := w0.Push(ctx, 1, []uint64{900, 10}, []float32{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	if err := w1.Pull(ctx, 1, keys, out); err != nil {
		t.Fatal(err)
	}
	want := [][]float32{
		{initial(spec, 10)[0] - 0.5*3, initial(spec, 10)[1] - 0.5*4},
		{initial(spec, 900)[0] - 0.5*1, initial(spec, 900)[1] - 0.5*2},
		initial(spec, 11),
	}
	for i := range keys {
		if !near(out[2*i:2*i+2], want[i]) {
			t.Errorf("key %d after a push: %v, want %v", keys[i], out[2*i:2*i+2], want[i])
		}
	}
}

// TestBSP: a clock's gradients are averaged over the workers and applied
// when the last one pushes; a pull of the next clock waits until then.
func TestBSP(t *testing.T) {
	spec := sgdTable(1)
	c := newCluster(t, 2, 2, 0, []TableSpec{spec}, SyncSpec{Mode: BSP, Workers: 3})
	ctx := testContext(t)
	ws := []*Client{c.client(0, PartitionHash), c.client(1, PartitionHash), c.client(2, PartitionHash)}
	keys := []uint64{3, 500}
	for w, cl := range ws[:2] {
		if _, err := cl.Push(ctx, 1, keys, []float32{float32(w + 1), 1}); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan []float32, 1)
	go func() {
		out := make([]float32, 2)
		if err := ws[0].Pull(ctx, 1, keys, out); err != nil {
			t.Error(err)
		}
		got <- out
	}()
	for range 2 { // held on both shards
		if e := within(t, c.waits, "a held pull"); e.worker != 0 || e.clock != 1 {
			t.Fatalf("held pull %+v, want worker 0 at clock 1", e)
		}
	}
	if _, err := ws[2].Push(ctx, 1, keys, []float32{3, 1}); err != nil {
		t.Fatal(err)
	}
	out := within(t, got, "the held pull's rows")
	want := []float32{initial(spec, 3)[0] - 0.5*(1+2+3)/3, initial(spec, 500)[0] - 0.5*1}
	if !near(out, want) {
		t.Fatalf("after clock 0: %v, want %v", out, want)
	}
	if _, err := ws[0].Push(ctx, 1, keys, []float32{0, 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := ws[0].Push(ctx, 1, keys, []float32{0, 0}); err == nil || !strings.Contains(err.Error(), "while clock 1 is open") {
		t.Fatalf("a worker pushing ahead of bsp: %v", err)
	}
}

// TestSSP: with staleness 1 a worker may run one clock ahead of the
// slowest; a pull further ahead waits for the slowest to push.
func TestSSP(t *testing.T) {
	spec := sgdTable(1)
	c := newCluster(t, 1, 1, 0, []TableSpec{spec}, SyncSpec{Mode: SSP, Workers: 2, Staleness: 1})
	ctx := testContext(t)
	fast, slow := c.client(0, PartitionRange), c.client(1, PartitionRange)
	out := make([]float32, 1)
	for clock := range 2 { // clocks 0 and 1: at most one ahead of the slowest (at 0)
		if err := fast.Pull(ctx, 1, []uint64{1}, out); err != nil {
			t.Fatal(err)
		}
		if _, err := fast.Push(ctx, 1, []uint64{1}, []float32{1}); err != nil {
			t.Fatal(err)
		}
		if fast.Clock(1, 0) != int64(clock+1) {
			t.Fatalf("clock %d", fast.Clock(1, 0))
		}
	}
	done := make(chan error, 1)
	go func() { done <- fast.Pull(ctx, 1, []uint64{1}, out) }() // clock 2: two ahead
	if e := within(t, c.waits, "the fast worker's held pull"); e.worker != 0 || e.clock != 2 {
		t.Fatalf("held %+v, want worker 0 at clock 2", e)
	}
	if _, err := slow.Push(ctx, 1, []uint64{1}, []float32{1}); err != nil {
		t.Fatal(err)
	}
	if err := within(t, done, "the fast worker's pull"); err != nil {
		t.Fatal(err)
	}
	if want := initial(spec, 1)[0] - 0.5*3; !near(out, []float32{want}) {
		t.Fatalf("after three pushes: %v, want %v", out, want)
	}
}

// TestHybridClocks: a clock closes at the quorum (2 of 3); the third
// worker's push is stale and dropped, and it catches up with the shard's
// clock. With a quorum of all, the deadline closes a clock with fewer.
func TestHybridClocks(t *testing.T) {
	spec := sgdTable(1)
	c := newCluster(t, 1, 1, 0, []TableSpec{spec}, SyncSpec{Mode: Hybrid, Workers: 3, Quorum: 0.6, Deadline: time.Second})
	ctx := testContext(t)
	ws := []*Client{c.client(0, PartitionRange), c.client(1, PartitionRange), c.client(2, PartitionRange)}
	for w, g := range []float32{2, 4} {
		if stale, err := ws[w].Push(ctx, 1, []uint64{7}, []float32{g}); err != nil || stale != 0 {
			t.Fatalf("worker %d: stale %d, %v", w, stale, err)
		}
	}
	if stale, err := ws[2].Push(ctx, 1, []uint64{7}, []float32{100}); err != nil || stale != 1 {
		t.Fatalf("the late worker: stale %d, %v; want its push stale", stale, err)
	}
	out := make([]float32, 1)
	if err := ws[2].Pull(ctx, 1, []uint64{7}, out); err != nil {
		t.Fatal(err)
	}
	if want := initial(spec, 7)[0] - 0.5*3; !near(out, []float32{want}) || ws[2].Clock(1, 0) != 1 {
		t.Fatalf("after clock 0: %v (want %v), late worker at clock %d", out, want, ws[2].Clock(1, 0))
	}

	d := newCluster(t, 1, 1, 0, []TableSpec{spec}, SyncSpec{Mode: Hybrid, Workers: 2, Quorum: 1, Deadline: time.Second})
	a, b := d.client(0, PartitionRange), d.client(1, PartitionRange)
	if _, err := a.Push(ctx, 1, []uint64{7}, []float32{2}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- a.Pull(ctx, 1, []uint64{7}, out) }()
	within(t, d.waits, "the held pull")
	within(t, d.timers, "clock 0's deadline timer")() // clock 0's deadline passes
	if err := within(t, got, "the pull held until the deadline"); err != nil {
		t.Fatal(err)
	}
	if want := initial(spec, 7)[0] - 0.5*2; !near(out, []float32{want}) {
		t.Fatalf("closed at the deadline: %v, want %v", out, want)
	}
	if stale, err := b.Push(ctx, 1, []uint64{7}, []float32{5}); err != nil || stale != 1 {
		t.Fatalf("after the deadline: stale %d, %v", stale, err)
	}
}

// TestReplicatedPushes: every acknowledged push is on the backup, which
// holds bitwise the primary's rows; a retried push is applied once.
func TestReplicatedPushes(t *testing.T) {
	spec := sgdTable(4)
	spec.Optimizer = Adam
	c := newCluster(t, 2, 2, 1, []TableSpec{spec}, SyncSpec{Mode: ASP, Workers: 1})
	ctx := testContext(t)
	w := c.client(0, PartitionHash)
	for i := range 20 {
		keys := []uint64{uint64(i), uint64(i * 7 % 13), 999}
		grads := make([]float32, 12)
		for j := range grads {
			grads[j] = float32(i - j)
		}
		if _, err := w.Push(ctx, 1, keys, grads); err != nil {
			t.Fatal(err)
		}
	}
	for sh := range uint32(2) {
		p, b := int(sh)%2, (int(sh)+1)%2
		prim, back := c.rows(p, sh, 1), c.rows(b, sh, 1)
		if len(prim) == 0 || len(prim) != len(back) {
			t.Fatalf("shard %d: %d rows on the primary, %d on the backup", sh, len(prim), len(back))
		}
		for k, v := range prim {
			if !slices.Equal(v, back[k]) {
				t.Fatalf("shard %d key %d: primary %v, backup %v", sh, k, v, back[k])
			}
		}
	}
	// The same push id again (a retry after a failover) is not applied.
	tc := w.tables[1]
	sh := tc.part.Shard(999)
	before := c.rows(sh%2, uint32(sh), 1)[999]
	tc.step-- // the next push replays the last step: its id
	if _, err := w.Push(ctx, 1, []uint64{999}, []float32{1, 1, 1, 1}); err != nil {
		t.Fatal(err)
	}
	if got := w.Duplicates(1); got != 1 {
		t.Fatalf("%d pushes answered as duplicates, want 1", got)
	}
	if after := c.rows(sh%2, uint32(sh), 1)[999]; !slices.Equal(before, after) {
		t.Fatalf("a retried push changed key 999: %v, then %v", before, after)
	}
}

// TestBadRequests: bad keys, widths and gradients get an error naming the
// problem and change nothing; a peer speaking garbage is cut off while the
// server goes on serving others.
func TestBadRequests(t *testing.T) {
	dense := TableSpec{ID: 2, Name: "w", Dim: 1, Rows: 10, Optimizer: SGD, LR: 1}
	c := newCluster(t, 1, 1, 0, []TableSpec{sgdTable(2), dense}, SyncSpec{Mode: ASP, Workers: 1})
	ctx := testContext(t)
	w := c.client(0, PartitionRange)
	if _, err := w.Push(ctx, 2, []uint64{10}, []float32{1}); err == nil || !strings.Contains(err.Error(), "outside its 10 rows") {
		t.Errorf("a key outside a dense table: %v", err)
	}
	if _, err := w.Push(ctx, 1, []uint64{1}, []float32{float32(math.NaN()), 0}); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("a NaN gradient: %v", err)
	}
	var re *RemoteError
	if _, err := w.Push(ctx, 1, []uint64{1}, []float32{float32(math.Inf(1)), 0}); !errors.As(err, &re) || re.Status != StatusBadRequest {
		t.Errorf("an infinite gradient: %v, want a bad-request answer", err)
	}
	if rows := c.rows(0, 0, 1); len(rows) != 0 {
		t.Errorf("rejected pushes created rows: %v", rows)
	}
	conn, err := net.Dial("tcp", c.servers[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(strings.Repeat("GET / HTTP/1.1\r\n", 8))); err != nil {
		t.Fatal(err)
	}
	var hdr [headerSize]byte
	var buf Buffer
	f, err := ReadFrame(conn, &hdr, &buf)
	if err != nil || f.Status != StatusBadRequest || !strings.Contains(f.Message, "magic") {
		t.Fatalf("garbage answered with %+v, %v", f, err)
	}
	if _, err := ReadFrame(conn, &hdr, &buf); err == nil {
		t.Fatal("the garbage connection stays open")
	}
	out := make([]float32, 2)
	if err := w.Pull(ctx, 1, []uint64{1}, out); err != nil {
		t.Fatalf("the server stopped serving after garbage: %v", err)
	}
}

// TestClientCache: a pulled row serves later pulls from the worker's cache
// while its clock is at most CacheStaleness past the pull's; after that it
// is pulled again and shows the updates; the cache stays within its bound.
func TestClientCache(t *testing.T) {
	spec := sgdTable(1)
	c := newCluster(t, 1, 1, 0, []TableSpec{spec}, SyncSpec{Mode: ASP, Workers: 1})
	ctx := testContext(t)
	w, err := NewClient(ClientConfig{Worker: 0, Tables: []TableSpec{spec}, Partition: PartitionRange, Shards: 1,
		Sync: SyncSpec{Mode: ASP, Workers: 1}, Directory: c.dir(), CacheRows: 2, CacheStaleness: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	out := make([]float32, 1)
	if err := w.Pull(ctx, 1, []uint64{5}, out); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Push(ctx, 1, []uint64{5}, []float32{1}); err != nil { // clock 1: still fresh enough
		t.Fatal(err)
	}
	if err := w.Pull(ctx, 1, []uint64{5}, out); err != nil || w.CacheHits(1) != 1 || !near(out, initial(spec, 5)) {
		t.Fatalf("a pull one clock later: %v (hits %d), want the cached %v; %v", out, w.CacheHits(1), initial(spec, 5), err)
	}
	if _, err := w.Push(ctx, 1, []uint64{5}, []float32{1}); err != nil { // clock 2: too stale
		t.Fatal(err)
	}
	if err := w.Pull(ctx, 1, []uint64{5}, out); err != nil || w.CacheHits(1) != 1 || !near(out, []float32{initial(spec, 5)[0] - 1}) {
		t.Fatalf("a pull two clocks later: %v (hits %d), want the server's row after two pushes; %v", out, w.CacheHits(1), err)
	}
	three := make([]float32, 3)
	if err := w.Pull(ctx, 1, []uint64{1, 2, 3}, three); err != nil {
		t.Fatal(err)
	}
	if n := len(w.tables[1].cache.at); n != 2 {
		t.Fatalf("%d rows cached, bound 2", n)
	}
}

// TestShardActorRestart: a shard actor that panics while taking a push is
// restarted by its supervisor with its rows and clocks; the client, told the
// shard was unavailable, sends the push again with the same id, and it
// counts once.
func TestShardActorRestart(t *testing.T) {
	spec := sgdTable(1)
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	var fired atomic.Bool
	srv, err := Listen(ServerConfig{Addr: "127.0.0.1:0", Tables: []TableSpec{spec}, Sync: SyncSpec{Mode: ASP, Workers: 1}, System: sys,
		Applied: func(_, _, _ uint32, id uint64, _ int64, _ PushAction) {
			if id == 2 && fired.CompareAndSwap(false, true) {
				panic("injected failure in the shard after applying push 2")
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := testContext(t)
	w := serveOneShard(t, ctx, srv, spec)
	for range 3 {
		if _, err := w.Push(ctx, 1, []uint64{4}, []float32{1}); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]float32, 1)
	if err := w.Pull(ctx, 1, []uint64{4}, out); err != nil {
		t.Fatal(err)
	}
	if want := initial(spec, 4)[0] - 3*0.5; !fired.Load() || !near(out, []float32{want}) {
		t.Fatalf("after 3 pushes and a restart: %v, want %v (fired %v)", out, want, fired.Load())
	}
}

// testContext ends with the test, and after two minutes at the latest, so
// that a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB) context.Context { return testwait.Context(t, 2*time.Minute) }

// within receives from ch, failing the test, naming what it waited for,
// after 30 seconds.
func within[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return testwait.Recv(t, ch, 30*time.Second, what)
}

// TestServerAdvertise: a server bound to every interface needs an address
// to advertise and says which flag gives it; bound to every IPv6
// interface and advertising ::1, clients reach it there.
func TestServerAdvertise(t *testing.T) {
	spec := sgdTable(1)
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	cfg := ServerConfig{Addr: "0.0.0.0:0", Tables: []TableSpec{spec}, Sync: SyncSpec{Mode: ASP, Workers: 1}, System: sys}
	if _, err := Listen(cfg); err == nil || !strings.Contains(err.Error(), "pass --advertise HOST") {
		t.Fatalf("Listen on 0.0.0.0:0 without an address to advertise: %v", err)
	}
	cfg.Addr, cfg.Advertise = "[::]:0", "::1"
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !strings.HasPrefix(srv.Addr(), "[::1]:") || strings.HasSuffix(srv.Addr(), ":0") {
		t.Fatalf("the server advertises %s, want [::1] and its bound port", srv.Addr())
	}
	ctx := testContext(t)
	w := serveOneShard(t, ctx, srv, spec)
	if _, err := w.Push(ctx, 1, []uint64{4}, []float32{1}); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 1)
	if err := w.Pull(ctx, 1, []uint64{4}, out); err != nil {
		t.Fatal(err)
	}
	if want := initial(spec, 4)[0] - 0.5; !near(out, []float32{want}) {
		t.Fatalf("pulled %v over [::1], want %v", out, want)
	}
}

// serveOneShard makes srv the primary of shard 0, the only one, and
// returns an ASP client of it, closed with the test.
func serveOneShard(t *testing.T, ctx context.Context, srv *Server, spec TableSpec) *Client {
	t.Helper()
	if err := srv.Host(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := srv.SetRole(ctx, 0, true, nil, 1); err != nil {
		t.Fatal(err)
	}
	w, err := NewClient(ClientConfig{Worker: 0, Tables: []TableSpec{spec}, Partition: PartitionRange, Shards: 1,
		Sync: SyncSpec{Mode: ASP, Workers: 1}, Directory: StaticDirectory{srv.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}
