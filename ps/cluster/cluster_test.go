package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
)

// startEtcd runs an in-process etcd for the test, in its own directory on
// loopback ports chosen at start, and returns a client of it.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	return newEtcdClient(t, startEtcdServer(t).Endpoints()...)
}

func startEtcdServer(t *testing.T) *coordinator.Embedded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

func newEtcdClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// startEtcdBehindProxy is startEtcd with the client's connections going
// through a loopback proxy, and a function that cuts them off for good, as
// a partition would (at once: etcd itself takes seconds to stop while
// clients are connected).
func startEtcdBehindProxy(t *testing.T) (*clientv3.Client, func()) {
	t.Helper()
	u, err := url.Parse(startEtcdServer(t).Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		cut   bool
		wg    sync.WaitGroup
	)
	keep := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if cut {
			c.Close()
			return false
		}
		conns = append(conns, c)
		return true
	}
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		dst.Close()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil || !keep(c) {
				return
			}
			up, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			if !keep(up) {
				c.Close()
				return
			}
			wg.Add(2)
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	stop := sync.OnceFunc(func() {
		ln.Close()
		mu.Lock()
		cut = true
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	t.Cleanup(stop)
	return newEtcdClient(t, ln.Addr().String()), stop
}

// jobKeys is the key layout of a job named after the test (each test has
// its own etcd, so -count reruns start from nothing).
func jobKeys(t *testing.T) coordinator.Keys {
	t.Helper()
	keys, err := coordinator.KeysFor(strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// testContext bounds every wait of a test; it ends after the test's
// cleanups, so that they can use it too.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// recv waits for a value on ch, failing the test when ctx ends first.
func recv[T any](t *testing.T, ctx context.Context, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("waiting for %s: %v", what, ctx.Err())
		var zero T
		return zero
	}
}

// sparseJob is a small valid job: one sparse sgd table of 2-float rows over
// a key space of 100, split by range (keys 0..49 on shard 0 of 2).
func sparseJob(consistency string) *phalanxpb.PSJob {
	return &phalanxpb.PSJob{Shards: 2, Replicas: 1, Partition: "range", Servers: 2, Workers: 1, Consistency: consistency,
		Tables: []*phalanxpb.PSTable{{Id: 7, Name: "emb", Dim: 2, KeySpace: 100, Init: "uniform", InitScale: 0.1, Seed: 3,
			Optimizer: "sgd", Lr: 0.5}}}
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

func TestSpecOf(t *testing.T) {
	good := []struct {
		name string
		edit func(j *phalanxpb.PSJob)
		want Spec
	}{
		{"bsp, range, sgd", func(*phalanxpb.PSJob) {}, Spec{
			Tables: []ps.TableSpec{{ID: 7, Name: "emb", Dim: 2, KeySpace: 100, Init: ps.InitUniform, InitScale: 0.1, Seed: 3,
				Optimizer: ps.SGD, LR: 0.5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, InitialAccumulator: 0.1}},
			Sync: ps.SyncSpec{Mode: ps.BSP, Workers: 1}, Partition: ps.PartitionRange, Shards: 2, Replicas: 1, Servers: 2}},
		{"hybrid, hash, a dense adam table and a sparse adagrad one", func(j *phalanxpb.PSJob) {
			j.Consistency, j.Partition, j.Workers, j.Quorum, j.DeadlineNanos, j.Decay = "hybrid", "hash", 4, 0.75, int64(50*time.Millisecond), 0.5
			j.Shards, j.Replicas, j.Servers = 3, 0, 1
			j.Tables = []*phalanxpb.PSTable{
				{Id: 1, Name: "dense", Dim: 4, Rows: 64, Init: "normal", InitScale: 0.01, Optimizer: "adam", Lr: 0.001},
				{Id: 2, Name: "sparse", Dim: 1, Init: "", Optimizer: "adagrad", Lr: 0.1},
			}
		}, Spec{
			Tables: []ps.TableSpec{
				{ID: 1, Name: "dense", Dim: 4, Rows: 64, Init: ps.InitNormal, InitScale: 0.01, Optimizer: ps.Adam, LR: 0.001,
					Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, InitialAccumulator: 0.1},
				{ID: 2, Name: "sparse", Dim: 1, Init: ps.InitZeros, Optimizer: ps.Adagrad, LR: 0.1,
					Beta1: 0.9, Beta2: 0.999, Eps: 1e-10, InitialAccumulator: 0.1},
			},
			Sync:      ps.SyncSpec{Mode: ps.Hybrid, Workers: 4, Quorum: 0.75, Deadline: 50 * time.Millisecond, Decay: 0.5},
			Partition: ps.PartitionHash, Shards: 3, Replicas: 0, Servers: 1}},
		{"ssp (staleness 2), zeros", func(j *phalanxpb.PSJob) {
			j.Consistency, j.Staleness, j.Workers = "ssp", 2, 3
			j.Tables[0].Init, j.Tables[0].InitScale = "zeros", 0
		}, Spec{
			Tables: []ps.TableSpec{{ID: 7, Name: "emb", Dim: 2, KeySpace: 100, Init: ps.InitZeros, Seed: 3,
				Optimizer: ps.SGD, LR: 0.5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, InitialAccumulator: 0.1}},
			Sync: ps.SyncSpec{Mode: ps.SSP, Workers: 3, Staleness: 2}, Partition: ps.PartitionRange, Shards: 2, Replicas: 1, Servers: 2}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			j := sparseJob("bsp")
			tc.edit(j)
			before := proto.Clone(j)
			got, err := SpecOf(j)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tables, tc.want.Tables) {
				t.Errorf("tables\n got %+v\nwant %+v", got.Tables, tc.want.Tables)
			}
			if !equalSpecs(got, tc.want) {
				t.Errorf("spec\n got %+v\nwant %+v", got, tc.want)
			}
			if !proto.Equal(j, before) {
				t.Errorf("SpecOf changed the job record: %v", j)
			}
		})
	}

	bad := []struct {
		name string
		edit func(j *phalanxpb.PSJob)
		want string // in the error
	}{
		{"unknown consistency", func(j *phalanxpb.PSJob) { j.Consistency = "eventual" }, `consistency "eventual"`},
		{"no consistency", func(j *phalanxpb.PSJob) { j.Consistency = "" }, `consistency ""`},
		{"no workers", func(j *phalanxpb.PSJob) { j.Workers = 0 }, "0 workers"},
		{"hybrid without a quorum", func(j *phalanxpb.PSJob) { j.Consistency, j.DeadlineNanos = "hybrid", 1e6 }, "hybrid quorum 0"},
		{"hybrid without a deadline", func(j *phalanxpb.PSJob) { j.Consistency, j.Quorum = "hybrid", 0.5 }, "hybrid deadline"},
		{"stale decay above 1", func(j *phalanxpb.PSJob) { j.Decay = 2 }, "stale decay 2"},
		{"bad partition", func(j *phalanxpb.PSJob) { j.Partition = "modulo" }, `partition "modulo"`},
		{"no partition", func(j *phalanxpb.PSJob) { j.Partition = "" }, `partition ""`},
		{"0 shards", func(j *phalanxpb.PSJob) { j.Shards = 0 }, "0 shards"},
		{"too many shards", func(j *phalanxpb.PSJob) { j.Shards = 1<<16 + 1 }, "65537 shards"},
		{"replicas = servers", func(j *phalanxpb.PSJob) { j.Replicas, j.Servers = 2, 2 }, "2 servers with 2 backups"},
		{"replicas > servers", func(j *phalanxpb.PSJob) { j.Replicas, j.Servers = 3, 1 }, "1 servers with 3 backups"},
		{"no servers", func(j *phalanxpb.PSJob) { j.Replicas, j.Servers = 0, 0 }, "0 servers"},
		{"no tables", func(j *phalanxpb.PSJob) { j.Tables = nil }, "without tables"},
		{"bad initialiser", func(j *phalanxpb.PSJob) { j.Tables[0].Init = "ones" }, `table "emb": initialiser "ones"`},
		{"bad optimizer", func(j *phalanxpb.PSJob) { j.Tables[0].Optimizer = "rmsprop" }, `optimizer "rmsprop"`},
		{"no optimizer", func(j *phalanxpb.PSJob) { j.Tables[0].Optimizer = "" }, `optimizer ""`},
		{"dim 0", func(j *phalanxpb.PSJob) { j.Tables[0].Dim = 0 }, `table "emb": dim 0`},
		{"no learning rate", func(j *phalanxpb.PSJob) { j.Tables[0].Lr = 0 }, `table "emb": learning rate 0`},
		{"negative init scale", func(j *phalanxpb.PSJob) { j.Tables[0].InitScale = -1 }, `table "emb": init scale -1`},
		{"range partition of an unbounded table", func(j *phalanxpb.PSJob) { j.Tables[0].KeySpace = 0 }, `table "emb": a range partition needs`},
		{"the second table bad", func(j *phalanxpb.PSJob) {
			j.Tables = append(j.Tables, &phalanxpb.PSTable{Id: 8, Name: "bias", Dim: 1, Rows: 10, Optimizer: "sgd", Lr: 1, Init: "he"})
		}, `table "bias": initialiser "he"`},
		{"two tables with one id", func(j *phalanxpb.PSJob) {
			j.Tables = append(j.Tables, &phalanxpb.PSTable{Id: 7, Name: "other", Dim: 1, KeySpace: 10, Optimizer: "sgd", Lr: 1})
		}, `table id 7 given twice (tables "emb" and "other")`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			j := sparseJob("bsp")
			tc.edit(j)
			_, err := SpecOf(j)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("SpecOf: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func equalSpecs(a, b Spec) bool {
	return a.Sync == b.Sync && a.Partition == b.Partition && a.Shards == b.Shards && a.Replicas == b.Replicas && a.Servers == b.Servers
}

func TestWriteReadJob(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	job := sparseJob("asp")

	t.Run("ReadJob waits for the job", func(t *testing.T) {
		keys := jobKeys(t)
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := ReadJob(short, coordinator.NewJob(cli, keys)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ReadJob of a job not written: %v, want it to wait until its context ends", err)
		}
		type result struct {
			j   *phalanxpb.PSJob
			err error
		}
		got := make(chan result, 1)
		go func() {
			j, err := ReadJob(ctx, coordinator.NewJob(cli, keys))
			got <- result{j, err}
		}()
		if err := WriteJob(ctx, coordinator.NewJob(cli, keys), job); err != nil {
			t.Fatal(err)
		}
		r := recv(t, ctx, got, "ReadJob")
		if r.err != nil || !proto.Equal(r.j, job) {
			t.Fatalf("ReadJob: %v, %v; want %v", r.j, r.err, job)
		}
	})

	t.Run("the same job twice", func(t *testing.T) {
		keys := jobKeys(t)
		for i := range 2 {
			if err := WriteJob(ctx, coordinator.NewJob(cli, keys), proto.Clone(job).(*phalanxpb.PSJob)); err != nil {
				t.Fatalf("write %d: %v", i+1, err)
			}
		}
		if j, err := ReadJob(ctx, coordinator.NewJob(cli, keys)); err != nil || !proto.Equal(j, job) {
			t.Fatalf("ReadJob: %v, %v", j, err)
		}
	})

	t.Run("another job under the same keys", func(t *testing.T) {
		keys := jobKeys(t)
		if err := WriteJob(ctx, coordinator.NewJob(cli, keys), job); err != nil {
			t.Fatal(err)
		}
		other := proto.Clone(job).(*phalanxpb.PSJob)
		other.Shards = 3
		err := WriteJob(ctx, coordinator.NewJob(cli, keys), other)
		if err == nil || !strings.Contains(err.Error(), keys.PSJob()) || !strings.Contains(err.Error(), "another job") {
			t.Fatalf("WriteJob of another job: %v, want an error saying %s holds another job", err, keys.PSJob())
		}
		if j, err := ReadJob(ctx, coordinator.NewJob(cli, keys)); err != nil || !proto.Equal(j, job) {
			t.Fatalf("after the refusal ReadJob gives %v, %v; want the first job", j, err)
		}
	})

	t.Run("an invalid job is not recorded", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			edit func(j *phalanxpb.PSJob)
			want string
		}{
			{"an unknown optimizer", func(j *phalanxpb.PSJob) { j.Tables[0].Optimizer = "rmsprop" }, "rmsprop"},
			{"two tables with one id", func(j *phalanxpb.PSJob) {
				j.Tables = append(j.Tables, &phalanxpb.PSTable{Id: 7, Name: "other", Dim: 1, KeySpace: 10, Optimizer: "sgd", Lr: 1})
			}, "table id 7 given twice"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				keys := jobKeys(t)
				bad := proto.Clone(job).(*phalanxpb.PSJob)
				tc.edit(bad)
				if err := WriteJob(ctx, coordinator.NewJob(cli, keys), bad); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("WriteJob of a bad job: %v, want an error saying %q", err, tc.want)
				}
				if resp, err := cli.Get(ctx, keys.PSJob()); err != nil || len(resp.Kvs) != 0 {
					t.Fatalf("the bad job was recorded: %v, %v", resp, err)
				}
			})
		}
	})

	// Records at the job's key that are not a job: ReadJob refuses each,
	// naming the key, and WriteJob does not write over it.
	marshal := func(m proto.Message) string {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	unchecked := proto.Clone(job).(*phalanxpb.PSJob) // as WriteJob would refuse it
	unchecked.Tables = append(unchecked.Tables, &phalanxpb.PSTable{Id: 7, Name: "other", Dim: 1, KeySpace: 10, Optimizer: "sgd", Lr: 1})
	for _, tc := range []struct {
		name, val string
		want      string // in ReadJob's error, after the key
	}{
		{"not protobuf", "not a job", " is not a parameter-server job"},
		{"an empty value", "", " is not a parameter-server job: the value is empty"},
		// A shard map decodes as a PSJob: generation 3 reads as 3 shards,
		// its reason as an unknown field.
		{"a shard map", marshal(&phalanxpb.ShardMap{Generation: 3, Reason: "a shard map, not a job"}), ` is not a valid parameter-server job: ps: consistency ""`},
		{"a job that does not check", marshal(unchecked), " is not a valid parameter-server job: cluster: table id 7 given twice"},
	} {
		t.Run("ReadJob of "+tc.name, func(t *testing.T) {
			keys := jobKeys(t)
			if _, err := cli.Put(ctx, keys.PSJob(), tc.val); err != nil {
				t.Fatal(err)
			}
			j, err := ReadJob(ctx, coordinator.NewJob(cli, keys))
			if err == nil || !strings.Contains(err.Error(), keys.PSJob()+tc.want) {
				t.Fatalf("ReadJob: %v, %v; want an error saying %q", j, err, keys.PSJob()+tc.want)
			}
			if err := WriteJob(ctx, coordinator.NewJob(cli, keys), job); err == nil || !strings.Contains(err.Error(), keys.PSJob()) {
				t.Fatalf("WriteJob over it: %v, want a refusal naming %s", err, keys.PSJob())
			}
		})
	}

	t.Run("ReadJob ends with its context", func(t *testing.T) {
		keys := jobKeys(t)
		cctx, cancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() {
			_, err := ReadJob(cctx, coordinator.NewJob(cli, keys))
			got <- err
		}()
		cancel()
		if err := recv(t, ctx, got, "ReadJob"); !errors.Is(err, context.Canceled) {
			t.Fatalf("ReadJob after cancel: %v", err)
		}
	})
}

// runningJob is a PS job on the test's etcd: the shard-map writer and the
// servers, each run by a goroutine until the test ends or it is stopped.
type runningJob struct {
	keys    coordinator.Keys
	spec    Spec
	maps    chan *phalanxpb.ShardMap // as the writer writes them
	writer  *routine                 // coordinator.RunShardMap
	servers map[string]*routine      // Serve, by server id
}

// routine is a goroutine of a running job.
type routine struct {
	addr string // a server's
	stop context.CancelFunc
	done chan struct{} // closed when it has returned err
	err  error
}

// wait waits until ro returns, and returns its error.
func (ro *routine) wait(t *testing.T, ctx context.Context, what string) error {
	t.Helper()
	select {
	case <-ro.done:
		return ro.err
	case <-ctx.Done():
		t.Fatalf("%s did not return: %v", what, ctx.Err())
		return nil
	}
}

// startJob records job, runs it on servers ids, and waits until each
// serves.
func startJob(t *testing.T, ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, job *phalanxpb.PSJob, ids ...string) *runningJob {
	t.Helper()
	spec, err := SpecOf(job)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteJob(ctx, coordinator.NewJob(cli, keys), job); err != nil {
		t.Fatal(err)
	}
	r := &runningJob{keys: keys, spec: spec, maps: make(chan *phalanxpb.ShardMap, 16), servers: map[string]*routine{}}
	mctx, stopMap := context.WithCancel(ctx)
	r.writer = &routine{stop: stopMap, done: make(chan struct{})}
	go func() {
		defer close(r.writer.done)
		r.writer.err = coordinator.NewJob(cli, keys).RunShardMap(mctx, coordinator.ShardMapConfig{ID: "writer", Shards: spec.Shards,
			Replicas: spec.Replicas, Servers: spec.Servers, SessionTTL: 5 * time.Second, OnMap: func(m *phalanxpb.ShardMap) { r.maps <- m }})
	}()
	// The writer stops first: servers stopping one by one would lose the
	// shards' last copies under it.
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // ctx may have ended
		defer cancel()
		r.writer.stop()
		r.writer.wait(t, cctx, "the shard-map writer")
		for id, s := range r.servers {
			s.stop()
			s.wait(t, cctx, "server "+id)
		}
	})
	for _, id := range ids {
		// A lease no pause of a loaded machine loses: tests end a server by
		// stopping it or revoking its lease, never by waiting one out.
		r.servers[id] = serveNode(t, ctx, cli, keys, NodeConfig{ID: id, Listen: "127.0.0.1:0", LeaseTTL: 10 * time.Second})
	}
	return r
}

// serveNode runs Serve until the routine is stopped, and waits until it
// serves (cfg.OnReady is set here).
func serveNode(t *testing.T, ctx context.Context, cli *clientv3.Client, keys coordinator.Keys, cfg NodeConfig) *routine {
	t.Helper()
	sctx, stop := context.WithCancel(ctx)
	s := &routine{stop: stop, done: make(chan struct{})}
	ready := make(chan string, 1)
	cfg.OnReady = func(addr string) { ready <- addr }
	go func() {
		defer close(s.done)
		s.err = Serve(sctx, coordinator.NewJob(cli, keys), cfg)
	}()
	select {
	case s.addr = <-ready:
	case <-s.done:
		t.Fatalf("server %s ended before serving: %v", cfg.ID, s.err)
	case <-ctx.Done():
		t.Fatalf("server %s not ready: %v", cfg.ID, ctx.Err())
	}
	return s
}

// client is worker w's client of the job, over a Directory of its map.
func (r *runningJob) client(t *testing.T, ctx context.Context, cli *clientv3.Client, w int) (*ps.Client, *Directory) {
	t.Helper()
	dctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	dir, err := NewDirectory(dctx, coordinator.NewJob(cli, r.keys))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := ps.NewClient(ps.ClientConfig{Worker: w, Tables: r.spec.Tables, Partition: r.spec.Partition, Shards: r.spec.Shards,
		Sync: r.spec.Sync, Directory: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl, dir
}

// placement is each shard's primary then backups.
func placement(m *phalanxpb.ShardMap) [][]string {
	var out [][]string
	for _, p := range m.Shards {
		out = append(out, append([]string{p.Primary}, p.Backups...))
	}
	return out
}

// TestServeFailover: two servers serve a job of two shards, each shard with
// a backup on the other server; a worker's pushes land on both copies.
// When one server goes (its context cancelled, or its lease revoked under
// it), the Directory follows the new map, in which its shards' backups are
// primaries, and the worker's pulls return the same rows from them.
func TestServeFailover(t *testing.T) {
	cli := startEtcd(t)
	for _, tc := range []struct {
		name, consistency string
		revoke            bool   // revoke the server's lease; else cancel its context
		wantErr           string // Serve's error for the server gone ("": nil)
	}{
		{name: "asp, server stopped", consistency: "asp"},
		{name: "bsp, server stopped", consistency: "bsp"},
		{name: "bsp, lease revoked", consistency: "bsp", revoke: true, wantErr: "lease was lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			keys := jobKeys(t)
			job := sparseJob(tc.consistency)
			r := startJob(t, ctx, cli, keys, job, "s0", "s1")
			first := recv(t, ctx, r.maps, "the first shard map")
			if got, want := placement(first), [][]string{{"s0", "s1"}, {"s1", "s0"}}; !slices.EqualFunc(got, want, slices.Equal) {
				t.Fatalf("first map %v, want %v", got, want)
			}
			cl, dir := r.client(t, ctx, cli, 0)
			if m := dir.Map(); m.Generation != 1 {
				t.Fatalf("the directory holds generation %d, want 1", m.Generation)
			}
			for sh, id := range []string{"s0", "s1"} {
				if addr, gen, err := dir.Primary(sh); err != nil || addr != r.servers[id].addr || gen != 1 {
					t.Fatalf("shard %d's primary: %s (generation %d), %v; want %s's %s", sh, addr, gen, err, id, r.servers[id].addr)
				}
			}
			if _, _, err := dir.Primary(2); err == nil {
				t.Fatal("a directory of 2 shards gave a primary of shard 2")
			}

			table := job.Tables[0].Id
			part, err := ps.NewPartitioner(r.spec.Partition, r.spec.Shards, &r.spec.Tables[0])
			if err != nil {
				t.Fatal(err)
			}
			keysOf := []uint64{3, 17, 49, 50, 64, 99}
			for i, k := range keysOf {
				if want := i / 3; part.Shard(k) != want {
					t.Fatalf("key %d on shard %d, want %d", k, part.Shard(k), want)
				}
			}
			const dim, lr = 2, float32(0.5)
			want := make([]float32, dim*len(keysOf))
			if err := cl.Pull(ctx, table, keysOf, want); err != nil {
				t.Fatal(err)
			}
			if slices.Equal(want, make([]float32, len(want))) {
				t.Fatalf("uniform rows start at zero: %v", want)
			}
			push := func(round int) {
				t.Helper()
				grads := make([]float32, len(want))
				for i := range grads {
					grads[i] = float32((i+round)%5) - 2
					want[i] -= lr * grads[i]
				}
				if _, err := cl.Push(ctx, table, keysOf, grads); err != nil {
					t.Fatalf("push %d: %v", round, err)
				}
			}
			check := func(when string) {
				t.Helper()
				got := make([]float32, len(want))
				if err := cl.Pull(ctx, table, keysOf, got); err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				if !near(got, want) {
					t.Fatalf("%s: rows %v, want %v", when, got, want)
				}
			}
			for round := range 3 {
				push(round)
				check(fmt.Sprintf("after push %d", round+1))
			}

			if tc.revoke {
				resp, err := cli.Get(ctx, keys.PSServer("s0"))
				if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
					t.Fatalf("s0's registration: %v, %v", resp, err)
				}
				if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
					t.Fatal(err)
				}
			} else {
				r.servers["s0"].stop()
			}
			err = r.servers["s0"].wait(t, ctx, "s0's Serve")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("s0 stopped: Serve returned %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("s0's lease revoked: Serve returned %v, want an error saying %q", err, tc.wantErr)
			}

			second := recv(t, ctx, r.maps, "the map without s0")
			if err := dir.Changed(ctx, 1); err != nil {
				t.Fatal(err)
			}
			m := dir.Map()
			if !proto.Equal(m, second) || m.Generation != 2 {
				t.Fatalf("the directory holds %v, the writer wrote %v", m, second)
			}
			if got, want := placement(m), [][]string{{"s1"}, {"s1"}}; !slices.EqualFunc(got, want, slices.Equal) {
				t.Fatalf("map without s0: %v, want %v", got, want)
			}
			if len(m.Failovers) != 1 || m.Failovers[0].Shard != 0 || m.Failovers[0].Old != "s0" || m.Failovers[0].New != "s1" {
				t.Fatalf("failovers %v, want shard 0 from s0 to s1", m.Failovers)
			}
			for sh := range 2 {
				if addr, gen, err := dir.Primary(sh); err != nil || addr != r.servers["s1"].addr || gen != 2 {
					t.Fatalf("shard %d's primary after the failover: %s (generation %d), %v; want s1's %s", sh, addr, gen, err, r.servers["s1"].addr)
				}
			}
			check("after s0 went")
			push(3)
			check("after a push to the promoted backup")

			// s1 goes too: the writer finds shards without a copy.
			r.servers["s1"].stop()
			if err := r.servers["s1"].wait(t, ctx, "s1's Serve"); err != nil {
				t.Fatalf("s1 stopped: Serve returned %v, want nil", err)
			}
			if err := r.writer.wait(t, ctx, "the shard-map writer"); !errors.Is(err, coordinator.ErrShardLost) {
				t.Fatalf("every server gone: the shard-map writer returned %v, want ErrShardLost", err)
			}
		})
	}
}

// TestDirectory follows shard maps written straight to etcd.
func TestDirectory(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	keys := jobKeys(t)
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
	srv := []*phalanxpb.PSServer{{Id: "a", Addr: "127.0.0.1:1001"}, {Id: "b", Addr: "127.0.0.1:1002"}}
	// A map need not list its shards in order: each is found by its Shard.
	gen1 := &phalanxpb.ShardMap{Generation: 1, Servers: srv, Shards: []*phalanxpb.ShardPlacement{
		{Shard: 2, Primary: "ghost"}, {Shard: 0, Primary: "a", Backups: []string{"b"}}, {Shard: 1, Primary: "b", Backups: []string{"a"}}}}

	type result struct {
		d   *Directory
		err error
	}
	dctx, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan result, 1)
	go func() {
		d, err := NewDirectory(dctx, coordinator.NewJob(cli, keys))
		got <- result{d, err}
	}()
	put(gen1)
	res := recv(t, ctx, got, "NewDirectory")
	if res.err != nil {
		t.Fatal(res.err)
	}
	d := res.d
	for _, tc := range []struct {
		shard   int
		addr    string
		wantErr string
	}{
		{0, "127.0.0.1:1001", ""},
		{1, "127.0.0.1:1002", ""},
		{2, "", "primary ghost has no address"},
		{3, "", "no shard 3 in a map of 3"},
		{-1, "", "no shard -1"},
	} {
		addr, gen, err := d.Primary(tc.shard)
		switch {
		case tc.wantErr == "" && (err != nil || addr != tc.addr || gen != 1):
			t.Errorf("Primary(%d): %s, %d, %v; want %s in generation 1", tc.shard, addr, gen, err, tc.addr)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("Primary(%d): %s, %v; want an error saying %q", tc.shard, addr, err, tc.wantErr)
		}
	}

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := d.Changed(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Changed with no new map: %v", err)
	}
	cancel()
	if err := d.Changed(ctx, 0); err != nil {
		t.Fatalf("Changed past generation 0: %v", err)
	}

	changed := make(chan error, 1)
	go func() { changed <- d.Changed(ctx, 1) }()
	gen2 := &phalanxpb.ShardMap{Generation: 2, Servers: srv[1:], Shards: []*phalanxpb.ShardPlacement{
		{Shard: 0, Primary: "b"}, {Shard: 1, Primary: "b"}, {Shard: 2, Primary: "b"}}}
	put(gen2)
	if err := recv(t, ctx, changed, "Changed"); err != nil {
		t.Fatal(err)
	}
	if m := d.Map(); !proto.Equal(m, gen2) {
		t.Fatalf("Map after generation 2: %v", m)
	}
	for sh := range 3 {
		if addr, gen, err := d.Primary(sh); err != nil || addr != "127.0.0.1:1002" || gen != 2 {
			t.Errorf("Primary(%d) in generation 2: %s, %d, %v", sh, addr, gen, err)
		}
	}

	// Once its context ends, the directory says it no longer follows.
	changed = make(chan error, 1)
	go func() { changed <- d.Changed(ctx, 2) }()
	stop()
	if err := recv(t, ctx, changed, "Changed after the directory stopped"); err == nil || !strings.Contains(err.Error(), "no longer followed") {
		t.Fatalf("Changed after the directory stopped: %v", err)
	}
	if _, _, err := d.Primary(0); err == nil || !strings.Contains(err.Error(), "no longer followed") {
		t.Fatalf("Primary after the directory stopped: %v", err)
	}

	t.Run("no map yet", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		other, err := coordinator.KeysFor("nomap")
		if err != nil {
			t.Fatal(err)
		}
		if d, err := NewDirectory(short, coordinator.NewJob(cli, other)); d != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("NewDirectory without a map: %v, %v; want it to wait until its context ends", d, err)
		}
	})

	t.Run("not a shard map", func(t *testing.T) {
		other, err := coordinator.KeysFor("badmap")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, other.ShardMap(), "not a map"); err != nil {
			t.Fatal(err)
		}
		// The watch fails at once; the bound only keeps a hang from
		// passing for that failure.
		bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		d, err := NewDirectory(bounded, coordinator.NewJob(cli, other))
		if d != nil || err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), other.ShardMap()+" is not a shard map") {
			t.Fatalf("NewDirectory over a value that is not a shard map: %v, %v; want an error saying %s is not one", d, err, other.ShardMap())
		}
	})

	t.Run("not a shard map after the first", func(t *testing.T) {
		other, err := coordinator.KeysFor("badlater")
		if err != nil {
			t.Fatal(err)
		}
		val, err := proto.Marshal(gen1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, other.ShardMap(), string(val)); err != nil {
			t.Fatal(err)
		}
		d, err := NewDirectory(ctx, coordinator.NewJob(cli, other))
		if err != nil {
			t.Fatal(err)
		}
		changed := make(chan error, 1)
		go func() { changed <- d.Changed(ctx, 1) }()
		if _, err := cli.Put(ctx, other.ShardMap(), "not a map"); err != nil {
			t.Fatal(err)
		}
		want := other.ShardMap() + " is not a shard map"
		if err := recv(t, ctx, changed, "Changed"); err == nil || !strings.Contains(err.Error(), "no longer followed") || !strings.Contains(err.Error(), want) {
			t.Fatalf("Changed after a value that is not a shard map: %v, want an error saying it is no longer followed: %s", err, want)
		}
		if _, _, err := d.Primary(0); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Primary after a value that is not a shard map: %v", err)
		}
	})
}

// TestServeStopsWithoutEtcd: a server cut off from etcd returns once its
// context ends; the revoke of its lease does not hold it.
func TestServeStopsWithoutEtcd(t *testing.T) {
	cli, cutOff := startEtcdBehindProxy(t)
	ctx := testContext(t)
	keys := jobKeys(t)
	job := sparseJob("asp")
	job.Replicas, job.Servers = 0, 1
	if err := WriteJob(ctx, coordinator.NewJob(cli, keys), job); err != nil {
		t.Fatal(err)
	}
	// A lease far longer than the revoke's bound (and than the test), so
	// that it is not lost meanwhile: Serve ends by its context.
	s := serveNode(t, ctx, cli, keys, NodeConfig{ID: "s0", Listen: "127.0.0.1:0", LeaseTTL: 10 * time.Minute})
	cutOff()
	s.stop()
	if err := s.wait(t, ctx, "Serve, cut off from etcd"); err != nil {
		t.Fatalf("Serve, cut off from etcd and its context cancelled: %v, want nil", err)
	}
}

func TestRevokeTimeout(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{0, time.Second},
		{300 * time.Millisecond, time.Second},
		{2 * time.Second, 2 * time.Second},
		{5 * time.Second, 5 * time.Second},
		{time.Minute, 5 * time.Second},
	} {
		if got := revokeTimeout(tc.ttl); got != tc.want {
			t.Errorf("revokeTimeout(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
}
