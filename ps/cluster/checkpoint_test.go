package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
)

// adamJob is a bsp job of one worker and one sparse adam table (rows carry
// optimizer state, which a checkpoint must keep).
func adamJob(partition string, shards int) *phalanxpb.PSJob {
	return &phalanxpb.PSJob{Shards: uint32(shards), Partition: partition, Servers: 1, Workers: 1, Consistency: "bsp",
		Tables: []*phalanxpb.PSTable{{Id: 4, Name: "emb", Dim: 2, KeySpace: 1000, Init: "uniform", InitScale: 0.1, Seed: 9,
			Optimizer: "adam", Lr: 0.01}}}
}

const adamTable = 4

// trainKeys spread over every shard of either partition; 5000 is beyond the
// key space (a range partition puts it on the last shard).
var trainKeys = []uint64{0, 1, 2, 7, 99, 100, 250, 333, 499, 500, 501, 640, 777, 850, 999, 5000}

func specOf(t *testing.T, j *phalanxpb.PSJob) Spec {
	t.Helper()
	s, err := SpecOf(j)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startServer runs one parameter server hosting every shard of spec, the
// primary of each with no backups once restore (when set) has run.
func startServer(t *testing.T, ctx context.Context, spec Spec, restore []ps.Snapshot) *ps.Server {
	t.Helper()
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Shutdown)
	srv, err := ps.Listen(ps.ServerConfig{Addr: "127.0.0.1:0", Tables: spec.Tables, Sync: spec.Sync, System: sys})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	for s := range spec.Shards {
		if err := srv.Host(ctx, uint32(s)); err != nil {
			t.Fatal(err)
		}
	}
	if restore != nil {
		if err := Restore(ctx, srv, spec, restore); err != nil {
			t.Fatal(err)
		}
	}
	for s := range spec.Shards {
		if err := srv.SetRole(ctx, uint32(s), true, nil, 1); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

func clientOf(t *testing.T, spec Spec, srv *ps.Server) *ps.Client {
	t.Helper()
	dir := make(ps.StaticDirectory, spec.Shards)
	for s := range dir {
		dir[s] = srv.Addr()
	}
	cl, err := ps.NewClient(ps.ClientConfig{Worker: 0, Tables: spec.Tables, Partition: spec.Partition, Shards: spec.Shards, Sync: spec.Sync, Directory: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// train pushes rounds of gradients of trainKeys (round r's differ from
// round r+1's).
func train(t *testing.T, ctx context.Context, cl *ps.Client, from, to int) {
	t.Helper()
	grads := make([]float32, 2*len(trainKeys))
	for r := from; r < to; r++ {
		for i := range grads {
			grads[i] = float32((i+r)%7) - 3
		}
		if _, err := cl.Push(ctx, adamTable, trainKeys, grads); err != nil {
			t.Fatalf("push %d: %v", r, err)
		}
	}
}

func pull(t *testing.T, ctx context.Context, cl *ps.Client) []float32 {
	t.Helper()
	out := make([]float32, 2*len(trainKeys))
	if err := cl.Pull(ctx, adamTable, trainKeys, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// rowsOf is every row (values and optimizer state) of snaps by key, and
// their clocks; a key in two snapshots fails the test.
func rowsOf(t *testing.T, snaps []ps.Snapshot) (map[uint64][]float32, []int64) {
	t.Helper()
	rows := map[uint64][]float32{}
	var clocks []int64
	for _, sn := range snaps {
		if sn.Table != adamTable {
			t.Fatalf("a snapshot of table %d", sn.Table)
		}
		clocks = append(clocks, sn.Clock)
		for i, k := range sn.Keys {
			if rows[k] != nil {
				t.Fatalf("key %d in two snapshots", k)
			}
			rows[k] = sn.Rows[i*sn.Stride : (i+1)*sn.Stride]
		}
	}
	return rows, clocks
}

// serverRows is every row srv holds, by shard.
func serverRows(t *testing.T, ctx context.Context, srv *ps.Server, shards int) []ps.Snapshot {
	t.Helper()
	var all []ps.Snapshot
	for s := range shards {
		snaps, err := srv.Snapshot(ctx, uint32(s))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, snaps...)
	}
	return all
}

func sameRows(a, b map[uint64][]float32) bool {
	return maps.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
}

// testStore is a checkpoint store and a way to damage one of its objects.
type testStore struct {
	name    string
	open    func(t *testing.T) checkpoint.Store
	corrupt func(t *testing.T, s checkpoint.Store, name string) // flip one byte
}

func localStore(t *testing.T) (checkpoint.Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := checkpoint.OpenURL(testContext(t), dir, checkpoint.Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// flipFile flips a byte in the middle of a local store's object file.
func flipFile(t *testing.T, s checkpoint.Store, name string) {
	t.Helper()
	p := filepath.Join(s.Location(), filepath.FromSlash(name))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// readObject reads a whole object.
func readObject(t *testing.T, s checkpoint.Store, name string) []byte {
	t.Helper()
	ctx := testContext(t)
	objs, err := s.List(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Name == name {
			b := make([]byte, o.Size)
			if err := s.ReadAt(ctx, name, b, 0); err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("no object %s in %s", name, s.Location())
	return nil
}

// replaceObject puts data in place of an object.
func replaceObject(t *testing.T, s checkpoint.Store, name string, data []byte) {
	t.Helper()
	ctx := testContext(t)
	if err := s.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, name, data); err != nil {
		t.Fatal(err)
	}
}

func stores() []testStore {
	return []testStore{
		{name: "local", open: func(t *testing.T) checkpoint.Store { s, _ := localStore(t); return s }, corrupt: flipFile},
		{name: "minio", open: func(t *testing.T) checkpoint.Store {
			m := miniotest.Start(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, err := checkpoint.NewS3Store(ctx, checkpoint.S3Options{Endpoint: m.Endpoint, Bucket: "phalanx", Prefix: "cluster",
				AccessKey: m.AccessKey, SecretKey: m.SecretKey, CreateBucket: true})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, corrupt: func(t *testing.T, s checkpoint.Store, name string) {
			b := readObject(t, s, name)
			b[len(b)/2] ^= 0x10
			replaceObject(t, s, name, b)
		}},
	}
}

func checkManifest(t *testing.T, what string, m, want *Manifest) {
	t.Helper()
	if m.Format != want.Format || m.Step != want.Step || m.Clock != want.Clock || m.Shards != want.Shards ||
		m.Partition != want.Partition || !slices.Equal(m.Objects, want.Objects) {
		t.Fatalf("%s: manifest %+v, want %+v", what, m, want)
	}
}

// checkLoaded checks what Latest or Load returned against the manifest the
// Saver wrote and the rows the server held.
func checkLoaded(t *testing.T, what string, m *Manifest, snaps []ps.Snapshot, err error, want *Manifest, rows map[uint64][]float32) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	checkManifest(t, what, m, want)
	got, clocks := rowsOf(t, snaps)
	if !sameRows(got, rows) {
		t.Fatalf("%s: rows %v, want %v", what, got, rows)
	}
	for _, c := range clocks {
		if c != want.Clock {
			t.Fatalf("%s: a snapshot at clock %d, want %d", what, c, want.Clock)
		}
	}
}

// TestSaveLatestLoad: a worker's Saver writes every shard's rows and then
// the manifest; Latest finds the newest checkpoint that verifies, skipping
// one without a manifest or with a corrupt object, and Load of a corrupt
// one names the object.
func TestSaveLatestLoad(t *testing.T) {
	for _, st := range stores() {
		t.Run(st.name, func(t *testing.T) {
			ctx := testContext(t)
			store := st.open(t)
			if _, _, err := Latest(ctx, store); !errors.Is(err, checkpoint.ErrNoCheckpoint) || !strings.Contains(err.Error(), store.Location()) {
				t.Fatalf("Latest of an empty store: %v, want ErrNoCheckpoint naming %s", err, store.Location())
			}
			spec := specOf(t, adamJob("hash", 2))
			srv := startServer(t, ctx, spec, nil)
			cl := clientOf(t, spec, srv)
			saver := &Saver{Store: store, Client: cl, Tables: []uint32{adamTable}, Spec: spec}

			manifests := map[int64]*Manifest{}
			rows := map[int64]map[uint64][]float32{}
			done := 0
			for _, step := range []int64{2, 4} {
				train(t, ctx, cl, done, int(step))
				done = int(step)
				rows[step], _ = rowsOf(t, serverRows(t, ctx, srv, spec.Shards))
				if len(rows[step]) != len(trainKeys) {
					t.Fatalf("the server holds %d rows, want %d", len(rows[step]), len(trainKeys))
				}
				m, err := saver.Save(ctx, step, step)
				if err != nil {
					t.Fatal(err)
				}
				want := &Manifest{Format: 1, Step: step, Clock: step, Shards: 2, Partition: "hash",
					Objects: []string{Prefix(step) + "shard-0000.snap", Prefix(step) + "shard-0001.snap"}}
				checkManifest(t, fmt.Sprintf("Save(%d)", step), m, want)
				manifests[step] = want
				m, snaps, err := Latest(ctx, store)
				checkLoaded(t, fmt.Sprintf("Latest after step %d", step), m, snaps, err, want, rows[step])
				m, snaps, err = Load(ctx, store, Prefix(step))
				checkLoaded(t, fmt.Sprintf("Load(%q)", Prefix(step)), m, snaps, err, want, rows[step])
			}
			if sameRows(rows[2], rows[4]) {
				t.Fatal("steps 3 and 4 changed no row")
			}

			// A checkpoint cut short before its manifest is not one.
			if err := store.Put(ctx, Prefix(9)+"shard-0000.snap", readObject(t, store, Prefix(4)+"shard-0000.snap")); err != nil {
				t.Fatal(err)
			}
			m, snaps, err := Latest(ctx, store)
			checkLoaded(t, "Latest with step 9 incomplete", m, snaps, err, manifests[4], rows[4])
			if _, _, err := Load(ctx, store, Prefix(9)); err == nil || !strings.Contains(err.Error(), "no manifest") {
				t.Fatalf("Load of step 9 without a manifest: %v", err)
			}

			t.Run("saved again after a save cut short", func(t *testing.T) {
				// A worker that failed while saving step 9, resumed from
				// step 4, reaches step 9 again.
				m, err := saver.Save(ctx, 9, 4)
				if err != nil {
					t.Fatal(err)
				}
				if m.Step != 9 {
					t.Fatalf("manifest %+v", m)
				}
				got, snaps, err := Load(ctx, store, Prefix(9))
				checkLoaded(t, "Load of step 9", got, snaps, err, m, rows[4])
				for _, name := range m.Objects {
					if err := store.Delete(ctx, name); err != nil {
						t.Fatal(err)
					}
				}
				if err := store.Delete(ctx, Prefix(9)+"manifest.json"); err != nil {
					t.Fatal(err)
				}
			})

			// Step 4 corrupt: Load names the object; Latest falls back to step 2.
			bad4 := Prefix(4) + "shard-0001.snap"
			st.corrupt(t, store, bad4)
			if _, _, err := Load(ctx, store, Prefix(4)); err == nil || !strings.Contains(err.Error(), bad4) || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("Load of step 4 with a flipped byte: %v, want an error naming %s as corrupt", err, bad4)
			}
			m, snaps, err = Latest(ctx, store)
			checkLoaded(t, "Latest with step 4 corrupt", m, snaps, err, manifests[2], rows[2])

			// Both corrupt: Latest names each.
			bad2 := Prefix(2) + "shard-0000.snap"
			st.corrupt(t, store, bad2)
			_, _, err = Latest(ctx, store)
			if err == nil || errors.Is(err, checkpoint.ErrNoCheckpoint) {
				t.Fatalf("Latest with every checkpoint corrupt: %v", err)
			}
			for _, want := range []string{Prefix(2) + "manifest.json", bad2, Prefix(4) + "manifest.json", bad4} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Latest with every checkpoint corrupt: %v; want it to name %s", err, want)
				}
			}
		})
	}
}

// TestLoadRefuses: a checkpoint damaged in any one way fails Load with an
// error naming what is wrong, and Latest skips it.
func TestLoadRefuses(t *testing.T) {
	ctx := testContext(t)
	pristine, _ := localStore(t)
	spec := specOf(t, adamJob("range", 2))
	cl := clientOf(t, spec, startServer(t, ctx, spec, nil))
	train(t, ctx, cl, 0, 2)
	if _, err := (&Saver{Store: pristine, Client: cl, Tables: []uint32{adamTable}, Spec: spec}).Save(ctx, 2, 2); err != nil {
		t.Fatal(err)
	}
	prefix := Prefix(2)
	manifest, shard0, shard1 := prefix+"manifest.json", prefix+"shard-0000.snap", prefix+"shard-0001.snap"
	writeFile := func(t *testing.T, s checkpoint.Store, name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(s.Location(), filepath.FromSlash(name)), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	manifestOf := func(format, shards int, objects ...string) string { // sealed: its checksum matches
		b, err := sealManifest(&Manifest{Format: format, Step: 2, Clock: 2, Shards: shards, Partition: "range", Objects: objects})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	edited := func(t *testing.T, s checkpoint.Store, edit func(m *Manifest)) {
		var m Manifest
		if err := json.Unmarshal(readObject(t, s, manifest), &m); err != nil {
			t.Fatal(err)
		}
		edit(&m)
		b, _ := json.Marshal(m)
		writeFile(t, s, manifest, string(b))
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, s checkpoint.Store)
		want   []string // in Load's error
	}{
		{"a flipped byte", func(t *testing.T, s checkpoint.Store) { flipFile(t, s, shard1) }, []string{shard1, "corrupt"}},
		{"a truncated object", func(t *testing.T, s checkpoint.Store) {
			writeFile(t, s, shard0, string(readObject(t, s, shard0)[:40]))
		}, []string{shard0}},
		{"an object that is not a snapshot", func(t *testing.T, s checkpoint.Store) { writeFile(t, s, shard1, "hello, world") },
			[]string{shard1}},
		{"a missing object", func(t *testing.T, s checkpoint.Store) {
			if err := s.Delete(ctx, shard0); err != nil {
				t.Fatal(err)
			}
		}, []string{shard0, "missing"}},
		{"no manifest", func(t *testing.T, s checkpoint.Store) {
			if err := s.Delete(ctx, manifest); err != nil {
				t.Fatal(err)
			}
		}, []string{prefix, "no manifest"}},
		{"a manifest that is not JSON", func(t *testing.T, s checkpoint.Store) { writeFile(t, s, manifest, "{format: 1") },
			[]string{"not a manifest"}},
		{"the step rewritten, the checksum kept", func(t *testing.T, s checkpoint.Store) { edited(t, s, func(m *Manifest) { m.Step = 1 }) },
			[]string{"changed or damaged"}},
		{"the clock rewritten, the checksum kept", func(t *testing.T, s checkpoint.Store) { edited(t, s, func(m *Manifest) { m.Clock = 3 }) },
			[]string{"changed or damaged"}},
		{"a manifest without its checksum", func(t *testing.T, s checkpoint.Store) { edited(t, s, func(m *Manifest) { m.Checksum = "" }) },
			[]string{"no checksum of its own"}},
		{"a manifest of format 2", func(t *testing.T, s checkpoint.Store) { writeFile(t, s, manifest, manifestOf(2, 2, shard0, shard1)) },
			[]string{"not a format-1 manifest"}},
		{"a manifest naming fewer objects than shards", func(t *testing.T, s checkpoint.Store) {
			writeFile(t, s, manifest, manifestOf(1, 2, shard0))
		}, []string{"not a format-1 manifest"}},
		{"a manifest naming an object of another checkpoint", func(t *testing.T, s checkpoint.Store) {
			writeFile(t, s, manifest, manifestOf(1, 2, shard0, Prefix(1)+"shard-0001.snap"))
		}, []string{Prefix(1) + "shard-0001.snap", "outside the checkpoint"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := localStore(t)
			for _, name := range []string{shard0, shard1, manifest} {
				if err := store.Put(ctx, name, readObject(t, pristine, name)); err != nil {
					t.Fatal(err)
				}
			}
			if _, _, err := Load(ctx, store, prefix); err != nil {
				t.Fatalf("the copy before the damage: %v", err)
			}
			tc.damage(t, store)
			_, _, err := Load(ctx, store, prefix)
			for _, want := range tc.want {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("Load: %v, want an error saying %q", err, want)
				}
			}
			_, _, err = Latest(ctx, store)
			if tc.name == "no manifest" {
				if !errors.Is(err, checkpoint.ErrNoCheckpoint) {
					t.Fatalf("Latest: %v, want ErrNoCheckpoint", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), manifest) || !strings.Contains(err.Error(), tc.want[len(tc.want)-1]) {
				t.Fatalf("Latest: %v, want an error naming %s and saying %q", err, manifest, tc.want[len(tc.want)-1])
			}
		})
	}
}

// TestRestoreReshard: a checkpoint of some shards restored into a job of
// another number of shards puts every row (values and optimizer state) on
// the shard the new partition gives it, once, and trains on identically.
func TestRestoreReshard(t *testing.T) {
	for _, tc := range []struct {
		partition string
		from, to  int
	}{
		{"hash", 2, 3},
		{"hash", 3, 1},
		{"range", 2, 5},
		{"range", 4, 2},
	} {
		t.Run(fmt.Sprintf("%s %d into %d", tc.partition, tc.from, tc.to), func(t *testing.T) {
			ctx := testContext(t)
			store, _ := localStore(t)
			from := specOf(t, adamJob(tc.partition, tc.from))
			old := startServer(t, ctx, from, nil)
			oldCl := clientOf(t, from, old)
			train(t, ctx, oldCl, 0, 3)
			if _, err := (&Saver{Store: store, Client: oldCl, Tables: []uint32{adamTable}, Spec: from}).Save(ctx, 3, 3); err != nil {
				t.Fatal(err)
			}
			want, _ := rowsOf(t, serverRows(t, ctx, old, from.Shards))
			m, snaps, err := Load(ctx, store, Prefix(3))
			if err != nil {
				t.Fatal(err)
			}
			if m.Shards != tc.from {
				t.Fatalf("a checkpoint of %d shards says %d", tc.from, m.Shards)
			}

			to := specOf(t, adamJob(tc.partition, tc.to))
			fresh := startServer(t, ctx, to, snaps)
			part, err := ps.NewPartitioner(to.Partition, to.Shards, &to.Tables[0])
			if err != nil {
				t.Fatal(err)
			}
			restored := serverRows(t, ctx, fresh, to.Shards)
			for s, sn := range restored {
				if sn.Clock != 3 {
					t.Errorf("shard %d restored at clock %d, want 3", s, sn.Clock)
				}
				for _, k := range sn.Keys {
					if part.Shard(k) != s {
						t.Errorf("key %d restored on shard %d, its shard is %d", k, s, part.Shard(k))
					}
				}
			}
			if got, _ := rowsOf(t, restored); !sameRows(got, want) {
				t.Fatalf("restored rows %v, want %v", got, want)
			}

			newCl := clientOf(t, to, fresh)
			if err := newCl.SetClock(adamTable, 3); err != nil {
				t.Fatal(err)
			}
			for round := 3; round < 5; round++ {
				if a, b := pull(t, ctx, oldCl), pull(t, ctx, newCl); !slices.Equal(a, b) {
					t.Fatalf("round %d: %d shards pull %v, the %d restored ones %v", round, tc.from, a, tc.to, b)
				}
				train(t, ctx, oldCl, round, round+1)
				train(t, ctx, newCl, round, round+1)
			}
		})
	}

	t.Run("refused", func(t *testing.T) {
		ctx := testContext(t)
		store, _ := localStore(t)
		spec := specOf(t, adamJob("hash", 2))
		cl := clientOf(t, spec, startServer(t, ctx, spec, nil))
		train(t, ctx, cl, 0, 1)
		if _, err := (&Saver{Store: store, Client: cl, Tables: []uint32{adamTable}, Spec: spec}).Save(ctx, 1, 1); err != nil {
			t.Fatal(err)
		}
		_, snaps, err := Load(ctx, store, Prefix(1))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			edit func(j *phalanxpb.PSJob)
			want string
		}{
			{"another optimizer", func(j *phalanxpb.PSJob) { j.Tables[0].Optimizer = "sgd" }, "another optimizer"},
			{"another table", func(j *phalanxpb.PSJob) { j.Tables[0].Id = 5 }, "table 4"},
		} {
			j := adamJob("hash", 2)
			tc.edit(j)
			other := specOf(t, j)
			sys, err := actors.NewSystem(actors.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sys.Shutdown)
			srv, err := ps.Listen(ps.ServerConfig{Addr: "127.0.0.1:0", Tables: other.Tables, Sync: other.Sync, System: sys})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
			for s := range other.Shards {
				if err := srv.Host(ctx, uint32(s)); err != nil {
					t.Fatal(err)
				}
			}
			if err := Restore(ctx, srv, other, snaps); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "shard 0") {
				t.Errorf("%s: Restore: %v, want an error about shard 0 saying %q", tc.name, err, tc.want)
			}
		}
	})
}

// TestServeRestores: servers of a job whose record names a checkpoint load
// it before they register, into the job's own number of shards, so the
// first pull sees the saved rows; a checkpoint that does not verify stops
// the server before it registers.
func TestServeRestores(t *testing.T) {
	cli := startEtcd(t)
	ctx := testContext(t)
	store, dir := localStore(t)
	from := specOf(t, adamJob("hash", 2))
	old := startServer(t, ctx, from, nil)
	oldCl := clientOf(t, from, old)
	train(t, ctx, oldCl, 0, 3)
	if _, err := (&Saver{Store: store, Client: oldCl, Tables: []uint32{adamTable}, Spec: from}).Save(ctx, 3, 3); err != nil {
		t.Fatal(err)
	}

	t.Run("into 3 shards", func(t *testing.T) {
		job := adamJob("hash", 3)
		job.Checkpoint, job.RestoreFrom, job.RestoreStep = dir, Prefix(3), 3
		r := startJob(t, ctx, cli, jobKeys(t), job, "r0")
		newCl, _ := r.client(t, ctx, cli, 0)
		if err := newCl.SetClock(adamTable, 3); err != nil {
			t.Fatal(err)
		}
		for round := 3; round < 5; round++ {
			if a, b := pull(t, ctx, oldCl), pull(t, ctx, newCl); !slices.Equal(a, b) {
				t.Fatalf("round %d: the saved job pulls %v, the restored one %v", round, a, b)
			}
			train(t, ctx, oldCl, round, round+1)
			train(t, ctx, newCl, round, round+1)
		}
	})

	t.Run("a corrupt checkpoint", func(t *testing.T) {
		bad, badDir := localStore(t)
		for _, name := range []string{"manifest.json", "shard-0000.snap", "shard-0001.snap"} {
			if err := bad.Put(ctx, Prefix(3)+name, readObject(t, store, Prefix(3)+name)); err != nil {
				t.Fatal(err)
			}
		}
		flipFile(t, bad, Prefix(3)+"shard-0001.snap")
		keys := jobKeys(t)
		job := adamJob("hash", 3)
		job.Checkpoint, job.RestoreFrom, job.RestoreStep = badDir, Prefix(3), 3
		if err := WriteJob(ctx, coordinator.NewJob(cli, keys), job); err != nil {
			t.Fatal(err)
		}
		err := Serve(ctx, coordinator.NewJob(cli, keys), NodeConfig{ID: "r0", Listen: "127.0.0.1:0", LeaseTTL: 10 * time.Second,
			OnReady: func(string) { t.Error("a server with a corrupt checkpoint became ready") }})
		if err == nil || !strings.Contains(err.Error(), Prefix(3)+"shard-0001.snap") {
			t.Fatalf("Serve: %v, want an error naming the corrupt object", err)
		}
		if resp, err := cli.Get(ctx, keys.PSServers(), clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
			t.Fatalf("registrations after the refusal: %v, %v", resp, err)
		}
	})
}

// TestSaveAgain: Save of a step whose checkpoint is already there keeps a
// complete one that verifies (returning its manifest, rewriting nothing)
// and replaces anything else under its prefix: objects of a save cut short
// before its manifest, or a checkpoint that does not verify.
func TestSaveAgain(t *testing.T) {
	ctx := testContext(t)
	spec := specOf(t, adamJob("hash", 2))
	srv := startServer(t, ctx, spec, nil)
	cl := clientOf(t, spec, srv)
	pristine, _ := localStore(t)
	saver := &Saver{Store: pristine, Client: cl, Tables: []uint32{adamTable}, Spec: spec}
	train(t, ctx, cl, 0, 2)
	rows2, _ := rowsOf(t, serverRows(t, ctx, srv, spec.Shards))
	saved, err := saver.Save(ctx, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	train(t, ctx, cl, 2, 4) // the saves below take the rows of clock 4
	rows4, _ := rowsOf(t, serverRows(t, ctx, srv, spec.Shards))
	if sameRows(rows2, rows4) {
		t.Fatal("steps 3 and 4 changed no row")
	}

	prefix := Prefix(2)
	manifest, shard0, shard1 := prefix+"manifest.json", prefix+"shard-0000.snap", prefix+"shard-0001.snap"
	copyObjects := func(t *testing.T, to checkpoint.Store, names ...string) {
		t.Helper()
		for _, name := range names {
			if err := to.Put(ctx, name, readObject(t, pristine, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	fresh := &Manifest{Format: 1, Step: 2, Clock: 4, Shards: 2, Partition: "hash", Objects: []string{shard0, shard1}}
	for _, tc := range []struct {
		name     string
		before   func(t *testing.T, s checkpoint.Store)
		want     *Manifest
		wantRows map[uint64][]float32
	}{
		{"nothing there", func(*testing.T, checkpoint.Store) {}, fresh, rows4},
		{"complete", func(t *testing.T, s checkpoint.Store) { copyObjects(t, s, shard0, shard1, manifest) }, saved, rows2},
		{"cut short after a shard", func(t *testing.T, s checkpoint.Store) { copyObjects(t, s, shard0) }, fresh, rows4},
		{"cut short after every shard", func(t *testing.T, s checkpoint.Store) { copyObjects(t, s, shard0, shard1) }, fresh, rows4},
		{"cut short, by a job of more shards", func(t *testing.T, s checkpoint.Store) {
			copyObjects(t, s, shard1)
			if err := s.Put(ctx, prefix+"shard-0002.snap", readObject(t, pristine, shard1)); err != nil {
				t.Fatal(err)
			}
		}, fresh, rows4},
		{"a corrupt object", func(t *testing.T, s checkpoint.Store) {
			copyObjects(t, s, shard0, shard1, manifest)
			flipFile(t, s, shard1)
		}, fresh, rows4},
		{"a manifest without its objects", func(t *testing.T, s checkpoint.Store) { copyObjects(t, s, manifest) }, fresh, rows4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := localStore(t)
			tc.before(t, store)
			before := map[string][]byte{}
			objs, err := store.List(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				before[o.Name] = readObject(t, store, o.Name)
			}

			m, err := (&Saver{Store: store, Client: cl, Tables: []uint32{adamTable}, Spec: spec}).Save(ctx, 2, 4)
			if err != nil {
				t.Fatalf("Save: %v", err)
			}
			checkManifest(t, "Save", m, tc.want)
			got, snaps, err := Load(ctx, store, prefix)
			checkLoaded(t, "Load", got, snaps, err, tc.want, tc.wantRows)
			objs, err = store.List(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, o := range objs {
				names = append(names, o.Name)
			}
			slices.Sort(names)
			if want := []string{manifest, shard0, shard1}; !slices.Equal(names, want) {
				t.Fatalf("objects after Save: %v, want %v", names, want)
			}
			if tc.want == saved {
				for name, b := range before {
					if !slices.Equal(readObject(t, store, name), b) {
						t.Errorf("Save rewrote %s of a complete checkpoint", name)
					}
				}
			}
		})
	}
}
