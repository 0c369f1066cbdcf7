package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"google.golang.org/protobuf/proto"
)

// modelTensors is a small state of a few shapes, some crossing block and
// shard boundaries.
func modelTensors() []Tensor {
	shapes := []struct {
		name  string
		shape []int64
		role  string
	}{
		{"fc1/w", []int64{33, 17}, "parameter"}, {"fc1/b", []int64{17}, "parameter"},
		{"fc2/w", []int64{17, 301}, "parameter"}, {"fc2/b", []int64{301}, "parameter"},
		{"fc1/w/momentum", []int64{33, 17}, "optimizer"}, {"empty", []int64{0}, "optimizer"},
	}
	var out []Tensor
	for _, s := range shapes {
		n := int64(1)
		for _, d := range s.shape {
			n *= d
		}
		out = append(out, Tensor{Name: s.name, Shape: s.shape, Role: s.role, Data: make([]float32, n)})
	}
	return out
}

// fill sets the state of step: every rank computes the same values.
func fill(ts []Tensor, step int64) {
	for i, t := range ts {
		for j := range t.Data {
			t.Data[j] = float32(step)*1000 + float32(i)*7 + float32(j)*0.25
		}
	}
}

func equalState(a, b []Tensor) error {
	for i := range a {
		for j := range a[i].Data {
			if math.Float32bits(a[i].Data[j]) != math.Float32bits(b[i].Data[j]) {
				return fmt.Errorf("tensor %s element %d: %v, want %v", a[i].Name, j, a[i].Data[j], b[i].Data[j])
			}
		}
	}
	return nil
}

// events collects checkpoint events from every rank.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (e *events) add(ev Event) { e.mu.Lock(); e.all = append(e.all, ev); e.mu.Unlock() }

func (e *events) kind(k string) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Event
	for _, ev := range e.all {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// job is world ranks training in process, each with its own Checkpointer.
type job struct {
	groups []*collective.Group
	ckpts  []*Checkpointer
	states [][]Tensor
	ev     *events
}

func newJob(t *testing.T, world int, gen uint64, store Store, cfg Config) *job {
	t.Helper()
	ctx := testContext(t)
	groups, err := collective.InprocGroups(ctx, world, "ckpt-test", gen, collective.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	j := &job{groups: groups, ev: &events{}}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, c := range j.ckpts {
			c.Close(cctx)
		}
		collective.CloseGroups(groups)
	})
	for r := range world {
		ts := modelTensors()
		c := cfg
		c.Store, c.Job, c.StateHash, c.ConfigHash, c.Seed = store, "test", "state-1", "config-1", 7
		c.OnEvent = j.ev.add
		if c.BlockBytes == 0 {
			c.BlockBytes = 4096
		}
		ck, err := New(c, ts)
		if err != nil {
			t.Fatal(err)
		}
		ck.Bind(Ring{Group: groups[r], Generation: gen, Decided: int64(gen) * 1000})
		j.ckpts, j.states = append(j.ckpts, ck), append(j.states, ts)
	}
	return j
}

// each runs f on every rank at once.
func (j *job) each(f func(r int) error) error {
	errs := make([]error, len(j.groups))
	var wg sync.WaitGroup
	for r := range j.groups {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = f(r) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// train runs steps from..to as a trainer would: the state changes, the votes
// travel in the step's allreduce, and AfterStep acts on their sums.
func (j *job) train(ctx context.Context, from, to, last int64, between func(r int, step int64)) error {
	return j.each(func(r int) error {
		for s := from; s <= to; s++ {
			fill(j.states[r], s)
			v := j.ckpts[r].Votes()
			if err := j.groups[r].AllReduce(ctx, collective.Float32s(v[:]), collective.Sum); err != nil {
				return err
			}
			stop, err := j.ckpts[r].AfterStep(ctx, Progress{Step: s, Epoch: s / 10, Offset: s % 10 * 32}, v, s == last)
			if err != nil {
				return fmt.Errorf("rank %d step %d: %w", r, s, err)
			}
			if between != nil {
				between(r, s)
			}
			if stop {
				return nil
			}
		}
		return nil
	})
}

func (j *job) restore(ctx context.Context, required bool) ([]*Restored, error) {
	out := make([]*Restored, len(j.groups))
	err := j.each(func(r int) error {
		res, err := j.ckpts[r].Restore(ctx, required)
		out[r] = res
		return err
	})
	return out, err
}

// TestSaveAndResumeReshaped: 4 ranks checkpoint every 3 steps; the newest
// checkpoint is restored bitwise into rings of 1, 3 and 5 ranks, with its
// step and position, and every checksum verifies.
func TestSaveAndResumeReshaped(t *testing.T) {
	ctx := testContext(t)
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			j := newJob(t, 4, 1, store, Config{EverySteps: 3})
			if err := j.train(ctx, 1, 10, 10, nil); err != nil {
				t.Fatal(err)
			}
			for _, c := range j.ckpts {
				if err := c.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			infos, err := List(ctx, store)
			if err != nil {
				t.Fatal(err)
			}
			var steps []int64
			for _, in := range infos {
				if !in.Complete {
					t.Errorf("incomplete checkpoint left: %+v", in)
				}
				steps = append(steps, in.Step)
			}
			if !slices.Equal(steps, []int64{10, 9, 6, 3}) {
				t.Fatalf("checkpoints at steps %v, want [10 9 6 3]", steps)
			}
			if n := len(j.ev.kind("saved")); n != 4 {
				t.Fatalf("%d saved events, want 4: %+v", n, j.ev.all)
			}
			m, err := ReadManifest(ctx, store, infos[0].ID)
			if err != nil {
				t.Fatal(err)
			}
			if m.World != 4 || len(m.Objects) != 4 || m.Step != 10 || m.Epoch != 1 || m.Offset != 0 || m.Seed != 7 || m.Sequence != 4 {
				t.Fatalf("manifest: world %d, %d objects, step %d, position %d/%d, seed %d, sequence %d", m.World, len(m.Objects), m.Step, m.Epoch, m.Offset, m.Seed, m.Sequence)
			}
			if err := Verify(ctx, store, m); err != nil {
				t.Fatal(err)
			}
			want := modelTensors()
			fill(want, 10)
			for _, world := range []int{1, 3, 5} {
				r := newJob(t, world, 2, store, Config{EverySteps: 3})
				res, err := r.restore(ctx, true)
				if err != nil {
					t.Fatal(err)
				}
				for rank := range world {
					if res[rank] == nil || res[rank].Manifest.Step != 10 || res[rank].Manifest.Epoch != 1 {
						t.Fatalf("world %d rank %d restored %v", world, rank, res[rank])
					}
					if err := equalState(r.states[rank], want); err != nil {
						t.Fatalf("world %d rank %d: %v", world, rank, err)
					}
				}
				ev := r.ev.kind("restored")
				if len(ev) != 1 || ev[0].WorldBefore != 4 || ev[0].WorldAfter != world || ev[0].Step != 10 {
					t.Fatalf("restored events: %+v", ev)
				}
			}
		})
	}
}

// corruptByte flips one byte of an object in a local store's directory.
func corruptByte(t *testing.T, dir, name string, at int64) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x40
	// The store never rewrites an object; the test does, as a disk would.
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// threeCheckpoints trains world ranks 6 steps into a new directory store,
// a checkpoint every 2 steps, and returns the newest and the one before.
func threeCheckpoints(t *testing.T, ctx context.Context, world int) (dir string, store *LocalStore, newest, middle Info) {
	t.Helper()
	dir = t.TempDir()
	store, err := NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t, world, 1, store, Config{EverySteps: 2})
	if err := j.train(ctx, 1, 6, 6, nil); err != nil {
		t.Fatal(err)
	}
	infos, _ := List(ctx, store)
	if len(infos) != 3 {
		t.Fatalf("checkpoints: %+v", infos)
	}
	return dir, store, infos[0], infos[1]
}

// resumesFrom restores a ring of 2 from store and checks that it resumed
// from want; it returns the ring, its events in hand.
func resumesFrom(t *testing.T, ctx context.Context, store Store, want Info) *job {
	t.Helper()
	r := newJob(t, 2, 2, store, Config{})
	res, err := r.restore(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Manifest.Id != want.ID {
		t.Fatalf("resumed from %s, want %s", res[0].Manifest.Id, want.ID)
	}
	return r
}

// TestResumeSkipsCorruptAndIncomplete: a flipped byte in the newest
// checkpoint's shard makes the resume take the previous one and say why; a
// checkpoint whose manifest is gone is not seen at all.
func TestResumeSkipsCorruptAndIncomplete(t *testing.T) {
	ctx := testContext(t)
	dir, store, newest, middle := threeCheckpoints(t, ctx, 3)
	m, err := ReadManifest(ctx, store, newest.ID)
	if err != nil {
		t.Fatal(err)
	}
	corruptByte(t, dir, newest.ID+"/"+m.Objects[1].Name, 5)
	var ce *CorruptError
	if err := Verify(ctx, store, m); !errors.As(err, &ce) || ce.Object != m.Objects[1].Name {
		t.Fatalf("verify of the corrupted checkpoint: %v", err)
	}

	r := resumesFrom(t, ctx, store, middle)
	want := modelTensors()
	fill(want, 4)
	if err := equalState(r.states[1], want); err != nil {
		t.Fatal(err)
	}
	skipped := r.ev.kind("skipped")
	if len(skipped) == 0 || skipped[0].ID != newest.ID || !strings.Contains(skipped[0].Err, "checksum") || !strings.Contains(skipped[0].Err, m.Objects[1].Name) {
		t.Fatalf("skipped events %+v: want the corrupt checkpoint named with its checksum failure", skipped)
	}

	// Without its manifest the middle one does not exist: the oldest is taken.
	if err := store.Delete(ctx, middle.ID+"/"+ManifestName); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, newest.ID, ManifestName)); err != nil {
		t.Fatal(err)
	}
	r2 := newJob(t, 2, 3, store, Config{})
	res, err := r2.restore(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Manifest.Step != 2 || len(r2.ev.kind("skipped")) != 0 {
		t.Fatalf("resumed from step %d with skips %+v, want step 2 and none", res[0].Manifest.Step, r2.ev.kind("skipped"))
	}
}

// TestManifestChecksum: a manifest is stored with its own checksum last;
// any one byte of it changed, its checksum field missing, or a field
// rewritten without the checksum, is refused by name, before any of its
// numbers is believed.
func TestManifestChecksum(t *testing.T) {
	ts := modelTensors()
	fill(ts, 3)
	l := newLayout(ts, 4096, 2)
	stream := make([]byte, l.total)
	copyOut(ts, l.offsets, 0, l.total, stream)
	m := buildManifest(Meta{ID: NewID(8, 1, 1), Step: 8, Epoch: 8, World: 2}, ts, stream, l)
	good, err := EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeManifest(m.Id, good); err != nil || got.Epoch != 8 || got.ManifestCrc32C != crc(good[:len(good)-digestLen]) {
		t.Fatalf("the manifest as written: %v (%+v)", err, got)
	}
	edited := proto.Clone(m).(*phalanxpb.Manifest)
	edited.Epoch = 7
	bare, _ := proto.MarshalOptions{Deterministic: true}.Marshal(edited)
	tests := []struct {
		name, want string
		b          []byte
	}{
		{"the epoch rewritten, the checksum kept", "changed or damaged", append(bare, good[len(good)-digestLen:]...)},
		{"no checksum field", "does not end with its own checksum", good[:len(good)-digestLen]},
		{"the checksum's last byte cut", "does not end with its own checksum", good[:len(good)-1]},
		{"empty", "does not end with its own checksum", nil},
	}
	for at := range good {
		b := bytes.Clone(good)
		b[at] ^= 0x01
		want := "changed or damaged"
		if at >= len(good)-digestLen && at < len(good)-4 {
			want = "does not end with its own checksum"
		}
		tests = append(tests, struct {
			name, want string
			b          []byte
		}{fmt.Sprintf("byte %d of %d flipped", at, len(good)), want, b})
	}
	for _, tc := range tests {
		_, err := DecodeManifest(m.Id, tc.b)
		var me *ManifestError
		if !errors.As(err, &me) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a ManifestError saying %q", tc.name, err, tc.want)
		}
	}
}

// TestResumeSkipsChangedManifest: the newest checkpoint's manifest with its
// epoch moved by one and its checksum left as it was: the resume
// refuses it, says why, and takes the one before; it never trains an epoch
// again on the word of a changed manifest.
func TestResumeSkipsChangedManifest(t *testing.T) {
	ctx := testContext(t)
	dir, store, newest, middle := threeCheckpoints(t, ctx, 2)
	p := filepath.Join(dir, newest.ID, ManifestName)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeManifest(newest.ID, b)
	if err != nil {
		t.Fatal(err)
	}
	m.Epoch++
	m.ManifestCrc32C = 0
	bare, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err := os.WriteFile(p, append(bare, b[len(b)-digestLen:]...), 0o644); err != nil {
		t.Fatal(err)
	}
	var me *ManifestError
	if _, err := ReadManifest(ctx, store, newest.ID); !errors.As(err, &me) {
		t.Fatalf("reading the changed manifest: %v, want a ManifestError", err)
	}
	r := resumesFrom(t, ctx, store, middle)
	skipped := r.ev.kind("skipped")
	if len(skipped) != 1 || skipped[0].ID != newest.ID || !strings.Contains(skipped[0].Err, "changed or damaged") {
		t.Fatalf("skipped events %+v: want the changed manifest named, with why", skipped)
	}
}

// TestResumeRefusesOtherModel: a checkpoint of other shapes or another
// state hash is an error, never loaded.
func TestResumeRefusesOtherModel(t *testing.T) {
	ctx := testContext(t)
	store, _ := NewLocalStore(t.TempDir())
	j := newJob(t, 2, 1, store, Config{})
	if err := j.train(ctx, 1, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	r := newJob(t, 2, 2, store, Config{})
	for _, c := range r.ckpts {
		c.cfg.StateHash = "state-2"
	}
	var ie *IncompatibleError
	if _, err := r.restore(ctx, false); !errors.As(err, &ie) || !strings.Contains(err.Error(), "state-2") {
		t.Fatalf("got %v, want an IncompatibleError naming the hashes", err)
	}
	empty, _ := NewLocalStore(t.TempDir())
	e := newJob(t, 2, 1, empty, Config{})
	if res, err := e.restore(ctx, false); err != nil || res[0] != nil {
		t.Fatalf("empty store, not required: %v %v", res, err)
	}
	if _, err := e.restore(ctx, true); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty store, required: %v", err)
	}
}

// gatedStore holds every Put until released, so a test can act while an
// upload is in progress.
type gatedStore struct {
	Store
	started chan string
	release chan struct{}
}

func (g *gatedStore) Put(ctx context.Context, name string, data []byte) error {
	if !strings.HasSuffix(name, ManifestName) {
		select { // retries and index objects come here too: never block on telling
		case g.started <- name:
		default:
		}
		select {
		case <-g.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Store.Put(ctx, name, data)
}

// TestStorageDownDuringUpload: MinIO is killed while shards are being
// uploaded; the checkpoint is reported failed, never complete, training goes
// on, and once MinIO is back the next checkpoint completes.
func TestStorageDownDuringUpload(t *testing.T) {
	ctx := testContext(t)
	srv := startMinio(t)
	inner := minioStore(t, srv, "down")
	gs := &gatedStore{Store: inner, started: make(chan string, 16), release: make(chan struct{})}
	j := newJob(t, 2, 1, gs, Config{EverySteps: 2, Wait: 2 * time.Second,
		Backoff: Backoff{First: 20 * time.Millisecond, Max: 200 * time.Millisecond}})
	var once sync.Once
	err := j.train(ctx, 1, 6, 6, func(r int, step int64) {
		switch step {
		case 2: // both ranks' uploads of step 2 have begun: kill the server under them
			once.Do(func() {
				for i := range 2 {
					select {
					case <-gs.started:
					case <-time.After(time.Minute):
						t.Errorf("waited a minute for upload %d of step 2 to begin", i+1)
					}
				}
				srv.Stop()
				close(gs.release)
			})
		case 4: // the step-2 checkpoint has failed; step 4's upload retries: bring MinIO back
			j.ckpts[r].cfg.Wait = time.Minute // from here on storage is up: no upload may be cut short
			if r == 0 {
				srv.Restart()
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	infos, err := List(ctx, inner)
	if err != nil {
		t.Fatal(err)
	}
	var complete []int64
	for _, in := range infos {
		if in.Complete {
			complete = append(complete, in.Step)
		}
	}
	if slices.Contains(complete, 2) || !slices.Contains(complete, 6) {
		t.Fatalf("complete checkpoints at steps %v: want 6 (and never 2)", complete)
	}
	failed := j.ev.kind("failed")
	if len(failed) == 0 || failed[0].Step != 2 || failed[0].Err == "" {
		t.Fatalf("failed events %+v: want step 2's with a reason", failed)
	}
	t.Logf("step 2: %s", failed[0].Err)
}

// TestStopRequest: a stop asked of one rank makes every rank checkpoint at
// the next boundary and stop there.
func TestStopRequest(t *testing.T) {
	ctx := testContext(t)
	store, _ := NewLocalStore(t.TempDir())
	j := newJob(t, 3, 1, store, Config{EverySteps: 100})
	stopped := make([]int64, 3)
	err := j.train(ctx, 1, 50, 50, func(r int, step int64) {
		stopped[r] = step
		if r == 2 && step == 7 {
			j.ckpts[2].RequestStop()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(stopped, []int64{8, 8, 8}) {
		t.Fatalf("ranks stopped after steps %v, want 8 each", stopped)
	}
	infos, _ := List(ctx, store)
	if len(infos) != 1 || !infos[0].Complete || infos[0].Step != 8 {
		t.Fatalf("checkpoints %+v: want one complete at step 8", infos)
	}
}

// TestRetention keeps the last two and every third by sequence, and cleans
// up what failed uploads left.
func TestRetention(t *testing.T) {
	ctx := testContext(t)
	store, _ := NewLocalStore(t.TempDir())
	j := newJob(t, 2, 1, store, Config{EverySteps: 1, Retention: Retention{KeepLast: 2, KeepEvery: 3}})
	if err := j.train(ctx, 1, 8, 8, nil); err != nil {
		t.Fatal(err)
	}
	// A leftover of an abandoned upload, older than the newest checkpoint.
	store.Put(ctx, NewID(5, 9, 9)+"/shard-00000-of-00002", []byte("orphan"))
	if _, err := (Retention{KeepLast: 2, KeepEvery: 3}).Retain(ctx, store); err != nil {
		t.Fatal(err)
	}
	infos, _ := List(ctx, store)
	var steps []int64
	for _, in := range infos {
		steps = append(steps, in.Step)
	}
	if !slices.Equal(steps, []int64{8, 7, 6, 3}) {
		t.Fatalf("kept steps %v, want [8 7 6 3]", steps)
	}
}

// TestManifestRejectsInconsistency: hand-broken manifests are errors.
func TestManifestRejectsInconsistency(t *testing.T) {
	ts := modelTensors()
	fill(ts, 1)
	l := newLayout(ts, 4096, 3)
	stream := make([]byte, l.total)
	copyOut(ts, l.offsets, 0, l.total, stream)
	good := buildManifest(Meta{ID: NewID(1, 1, 1), Step: 1, World: 3}, ts, stream, l)
	if err := validate(good); err != nil {
		t.Fatal(err)
	}
	for name, breakIt := range map[string]func(m *phalanxpb.Manifest){
		"format":          func(m *phalanxpb.Manifest) { m.Format = 2 },
		"step vs name":    func(m *phalanxpb.Manifest) { m.Step = 2 },
		"block count":     func(m *phalanxpb.Manifest) { m.BlockCrc32C = m.BlockCrc32C[1:] },
		"object gap":      func(m *phalanxpb.Manifest) { m.Objects[1].Offset++ },
		"object name":     func(m *phalanxpb.Manifest) { m.Objects[0].Name = "../x" },
		"tensor shape":    func(m *phalanxpb.Manifest) { m.Tensors[0].Shape[0]++ },
		"segment":         func(m *phalanxpb.Manifest) { m.Tensors[2].Segments[0].Offset++ },
		"segment object":  func(m *phalanxpb.Manifest) { m.Tensors[2].Segments[0].Object = 9 },
		"huge shape":      func(m *phalanxpb.Manifest) { m.Tensors[0].Shape = []int64{1 << 40, 1 << 40} },
		"negative dim":    func(m *phalanxpb.Manifest) { m.Tensors[0].Shape = []int64{-1} },
		"dtype":           func(m *phalanxpb.Manifest) { m.Tensors[0].Dtype = "float16" },
		"world":           func(m *phalanxpb.Manifest) { m.World = 2 },
		"duplicate names": func(m *phalanxpb.Manifest) { m.Tensors[1].Name = m.Tensors[0].Name },
	} {
		m := proto.Clone(good).(*phalanxpb.Manifest)
		breakIt(m)
		if err := validate(m); err == nil {
			t.Errorf("%s: a broken manifest validated", name)
		}
	}
}

// TestResumeNothingVerifies: when every checkpoint is corrupt, the resume
// fails naming the store rather than train afresh over a half-loaded state.
func TestResumeNothingVerifies(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	store, _ := NewLocalStore(dir)
	j := newJob(t, 2, 1, store, Config{})
	if err := j.train(ctx, 1, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	infos, _ := List(ctx, store)
	m, err := ReadManifest(ctx, store, infos[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	corruptByte(t, dir, m.Id+"/"+m.Objects[0].Name, 0)
	r := newJob(t, 2, 2, store, Config{})
	if _, err := r.restore(ctx, false); err == nil || !strings.Contains(err.Error(), "none of the 1 tried verifies") {
		t.Fatalf("got %v", err)
	}
}

// TestCheckpointEveryDuration: with a period in time, rank 0's clock decides
// and every rank checkpoints at the same step.
func TestCheckpointEveryDuration(t *testing.T) {
	ctx := testContext(t)
	store, _ := NewLocalStore(t.TempDir())
	var now atomic.Int64 // seconds, advanced by the test between steps
	clock := func() time.Time { return time.Unix(now.Load(), 0) }
	j := newJob(t, 3, 1, store, Config{Every: time.Minute, Now: clock})
	err := j.train(ctx, 1, 12, 12, func(r int, step int64) {
		if r == 0 && (step == 4 || step == 9) {
			now.Add(61) // rank 0 votes at the next step, the others follow
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	infos, _ := List(ctx, store)
	var steps []int64
	for _, in := range infos {
		steps = append(steps, in.Step)
	}
	if !slices.Equal(steps, []int64{12, 10, 5}) {
		t.Fatalf("checkpoints at %v, want [12 10 5]", steps)
	}
}

// testContext ends with the test, and after three minutes at the latest, so
// that a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB) context.Context { return testwait.Context(t, 3*time.Minute) }
