package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/logical"
)

// recordingStore is a store that records its calls, whose Delete of the
// name fail (if any) fails, and whose ReadAt of a name in readErr fails
// with its error.
type recordingStore struct {
	checkpoint.Store
	mu      sync.Mutex
	calls   int
	deletes []string
	fail    string
	readErr map[string]error
}

var errInjected = errors.New("injected delete failure")

func (s *recordingStore) List(ctx context.Context, prefix string) ([]checkpoint.ObjectInfo, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	return s.Store.List(ctx, prefix)
}

func (s *recordingStore) ReadAt(ctx context.Context, name string, p []byte, off int64) error {
	s.mu.Lock()
	s.calls++
	err := s.readErr[name]
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.Store.ReadAt(ctx, name, p, off)
}

func (s *recordingStore) Delete(ctx context.Context, name string) error {
	s.mu.Lock()
	s.calls++
	s.deletes = append(s.deletes, name)
	fail := s.fail != "" && name == s.fail
	s.mu.Unlock()
	if fail {
		return errInjected // naming nothing: retain's error must
	}
	return s.Store.Delete(ctx, name)
}

// retainFixture builds real pipeline checkpoints in a directory store:
// stage parts saved by checkpoint.Checkpointers, indexes built by indexOf
// and written by writeIndex. Every object is known by a label: an index's
// is its name, a part's is the prefix of its objects ("pipeline/p2-s0/<id>/").
type retainFixture struct {
	t      *testing.T
	ctx    context.Context
	store  checkpoint.Store
	ckpts  map[string]*checkpoint.Checkpointer // by stage prefix
	obj    map[string]string                   // label → index name or part prefix
	label  map[string]string                   // the reverse
	labels []string                            // in creation order
	owns   map[string][]string                 // index label → its parts' labels
}

func newRetainFixture(t *testing.T, ctx context.Context) *retainFixture {
	t.Helper()
	store, err := checkpoint.NewLocalStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &retainFixture{t: t, ctx: ctx, store: store, ckpts: map[string]*checkpoint.Checkpointer{},
		obj: map[string]string{}, label: map[string]string{}, owns: map[string][]string{}}
	t.Cleanup(func() {
		for _, c := range f.ckpts {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c.Close(ctx)
			cancel()
		}
	})
	return f
}

func (f *retainFixture) add(label, obj string) {
	f.t.Helper()
	if _, dup := f.obj[label]; dup {
		f.t.Fatalf("fixture: label %s twice", label)
	}
	f.obj[label], f.label[obj] = obj, label
	f.labels = append(f.labels, label)
}

// config is the job of a pipeline of p stages.
func (f *retainFixture) config(p int) *job.Config {
	c := job.DefaultConfig()
	c.Job, c.Model, c.Seed = "retain-test", "tiny", 7
	c.Pipeline = job.PipelineConfig{Stages: p, Replicas: 1}
	for s := 1; s < p; s++ {
		c.Pipeline.Cuts = append(c.Pipeline.Cuts, 2*s)
	}
	return &c
}

// save stores every stage's part of step (generation gen) of a p-stage
// pipeline, labelled label.s0, label.s1, ...
func (f *retainFixture) save(label string, p int, step int64, gen uint64) {
	f.t.Helper()
	c := f.config(p)
	for s := range p {
		prefix := fmt.Sprintf("pipeline/p%d-s%d/", p, s)
		ck := f.ckpts[prefix]
		if ck == nil {
			ts := []checkpoint.Tensor{{Name: fmt.Sprintf("fc%d.W", s), Role: "parameter", Shape: []int64{2}, Data: []float32{1, float32(s)}}}
			var err error
			ck, err = checkpoint.New(checkpoint.Config{Store: checkpoint.Prefixed(f.store, prefix), Job: c.Job, StateHash: stateHash(c),
				Seed: c.Seed, Wait: time.Minute}, ts)
			if err != nil {
				f.t.Fatal(err)
			}
			f.ckpts[prefix] = ck
		}
		id, err := ck.SaveAlone(f.ctx, checkpoint.Progress{Step: step}, gen)
		if err != nil {
			f.t.Fatal(err)
		}
		f.add(fmt.Sprintf("%s.s%d", label, s), prefix+id+"/")
	}
}

// index writes the index of step's parts (generation gen) of a p-stage
// pipeline, labelled label; step is the index's own step unless as >= 0.
func (f *retainFixture) index(label string, p int, step int64, gen uint64, as int64) {
	f.t.Helper()
	x, err := indexOf(f.ctx, f.store, f.config(p), step, [2]int64{0, step}, gen)
	if err != nil {
		f.t.Fatal(err)
	}
	if as >= 0 {
		x.Step = as
	}
	f.write(label, x)
}

func (f *retainFixture) write(label string, x *logical.Index) {
	f.t.Helper()
	name, err := logical.WriteIndex(f.ctx, f.store, x)
	if err != nil {
		f.t.Fatal(err)
	}
	f.add(label, name)
	for _, pt := range x.Parts {
		if l, ok := f.label[pt.Prefix+pt.ID+"/"]; ok {
			f.owns[label] = append(f.owns[label], l)
		}
	}
}

// saveIndexed saves and indexes step, both labelled by its step ("i<step>").
func (f *retainFixture) saveIndexed(p int, steps ...int64) {
	f.t.Helper()
	for _, step := range steps {
		f.save(fmt.Sprintf("i%d", step), p, step, 1)
		f.index(fmt.Sprintf("i%d", step), p, step, 1, -1)
	}
}

// put stores a raw object.
func (f *retainFixture) put(label, name string, b []byte) {
	f.t.Helper()
	if err := f.store.Put(f.ctx, name, b); err != nil {
		f.t.Fatal(err)
	}
	if strings.HasPrefix(name, logical.IndexPrefix) {
		f.add(label, name)
	} else {
		f.add(label, name[:strings.LastIndexByte(name, '/')+1])
	}
}

// exists reports whether the labelled object (or any object of the
// labelled part) is in the store.
func (f *retainFixture) exists(label string) bool {
	f.t.Helper()
	obj := f.obj[label]
	objs, err := f.store.List(f.ctx, obj)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, o := range objs {
		if o.Name == obj || strings.HasSuffix(obj, "/") {
			return true
		}
	}
	return false
}

// indexNameAt is the name writeIndex would give an index of step and gen.
func indexNameAt(step int64, gen uint64, t uint64) string {
	return fmt.Sprintf("%sstep-%012d-g%012d-%x.json", logical.IndexPrefix, step, gen, t)
}

func TestRetain(t *testing.T) {
	for _, c := range []struct {
		name    string
		r       retention
		setup   func(f *retainFixture)
		gone    []string // labels deleted; every other label is kept
		deleted []string // labels of the index names returned, in order
	}{
		{
			name: "keepLast 0 keeps everything", r: retention{keepLast: 0, keepEvery: 2, every: 10},
			setup: func(f *retainFixture) {
				f.save("orphan", 2, 5, 1)
				f.saveIndexed(2, 10, 20, 30, 40, 50)
				f.put("garbage", indexNameAt(60, 1, 1), []byte("not json"))
			},
		},
		{
			name: "keepLast -1 keeps everything", r: retention{keepLast: -1},
			setup: func(f *retainFixture) {
				f.save("orphan", 2, 5, 1)
				f.saveIndexed(2, 10, 20, 30)
			},
		},
		{
			name: "keepLast 2 of 5", r: retention{keepLast: 2},
			setup:   func(f *retainFixture) { f.saveIndexed(2, 10, 20, 30, 40, 50) },
			gone:    []string{"i10", "i10.s0", "i10.s1", "i20", "i20.s0", "i20.s1", "i30", "i30.s0", "i30.s1"},
			deleted: []string{"i10", "i20", "i30"},
		},
		{
			name: "keepLast beyond the indexes", r: retention{keepLast: 9},
			setup: func(f *retainFixture) {
				f.save("orphan", 2, 5, 1)
				f.saveIndexed(2, 10, 20, 30)
			},
			gone: []string{"orphan.s0", "orphan.s1"},
		},
		{
			name: "keepEvery keeps the multiples of keepEvery*every", r: retention{keepLast: 1, keepEvery: 2, every: 10},
			setup: func(f *retainFixture) { f.saveIndexed(3, 10, 20, 30, 40, 50, 60, 70) },
			gone: []string{"i10", "i10.s0", "i10.s1", "i10.s2", "i30", "i30.s0", "i30.s1", "i30.s2",
				"i50", "i50.s0", "i50.s1", "i50.s2"},
			deleted: []string{"i10", "i30", "i50"},
		},
		{
			name: "keepEvery without a period in steps keeps none", r: retention{keepLast: 1, keepEvery: 2},
			setup:   func(f *retainFixture) { f.saveIndexed(2, 10, 20, 30) },
			gone:    []string{"i10", "i10.s0", "i10.s1", "i20", "i20.s0", "i20.s1"},
			deleted: []string{"i10", "i20"},
		},
		{
			name: "a re-indexed part stays with its newer index", r: retention{keepLast: 1},
			setup: func(f *retainFixture) {
				f.saveIndexed(2, 10)
				f.save("p20", 2, 20, 1)
				f.index("old20", 2, 20, 1, -1)
				f.index("new20", 2, 20, 1, -1)
			},
			gone:    []string{"i10", "i10.s0", "i10.s1", "old20"},
			deleted: []string{"i10", "old20"},
		},
		{
			name: "a part named by a kept index stays though an older deleted index names it", r: retention{keepLast: 1},
			setup: func(f *retainFixture) {
				f.saveIndexed(2, 10, 30)
				f.index("old", 2, 30, 1, 20) // an index of step 20 naming step 30's parts
			},
			gone:    []string{"i10", "i10.s0", "i10.s1", "old"},
			deleted: []string{"i10", "old"},
		},
		{
			name: "a kept index's parts older than it are not orphans", r: retention{keepLast: 1},
			setup: func(f *retainFixture) {
				f.saveIndexed(2, 10, 20)
				f.index("late", 2, 10, 1, 40) // an index of step 40 naming step 10's parts
			},
			gone:    []string{"i10", "i20", "i20.s0", "i20.s1"},
			deleted: []string{"i10", "i20"},
		},
		{
			name: "a part two deleted indexes name goes once both are gone", r: retention{keepLast: 1},
			setup: func(f *retainFixture) {
				f.save("p10", 2, 10, 1)
				f.index("a10", 2, 10, 1, -1)
				f.index("b10", 2, 10, 1, -1)
				f.saveIndexed(2, 20)
			},
			gone:    []string{"p10.s0", "p10.s1", "a10", "b10"},
			deleted: []string{"a10", "b10"},
		},
		{
			name: "orphans older than the newest kept index go, newer ones stay", r: retention{keepLast: 2},
			setup: func(f *retainFixture) {
				f.save("o5", 2, 5, 1)
				f.put("o7", "pipeline/p2-s1/step-000000000007-g1-1a/part-0", []byte("an abandoned save's object"))
				f.saveIndexed(2, 10, 20, 30, 40)
				f.save("o25", 2, 25, 1)
				f.save("o30g2", 2, 30, 2) // older than the newest kept index: goes
				f.save("o40g2", 2, 40, 2) // the newest kept index's step: stays
				f.save("o35", 2, 35, 1)
				f.save("o50", 2, 50, 1) // newer than every index: perhaps a save in flight
				f.put("o60", "pipeline/p2-s0/step-000000000060-g1-1b/part-0", []byte("a save in flight"))
			},
			gone: []string{"o5.s0", "o5.s1", "o7", "i10", "i10.s0", "i10.s1", "i20", "i20.s0", "i20.s1",
				"o25.s0", "o25.s1", "o30g2.s0", "o30g2.s1", "o35.s0", "o35.s1"},
			deleted: []string{"i10", "i20"},
		},
		{
			name: "orphans newer than a kept older keepEvery index go", r: retention{keepLast: 1, keepEvery: 1, every: 20},
			setup: func(f *retainFixture) {
				f.save("o5", 2, 5, 1)
				f.saveIndexed(2, 10, 20, 30)
				f.save("o25", 2, 25, 1)
				f.save("o35", 2, 35, 1)
			},
			gone:    []string{"o5.s0", "o5.s1", "i10", "i10.s0", "i10.s1", "o25.s0", "o25.s1"},
			deleted: []string{"i10"},
		},
		{
			name: "undecodable indexes stay and are not counted", r: retention{keepLast: 2},
			setup: func(f *retainFixture) {
				f.saveIndexed(2, 10, 20, 30, 40)
				f.put("garbage", indexNameAt(50, 1, 99), []byte{0xff, 0x00, 0x13})
				f.put("empty", indexNameAt(45, 1, 99), nil)
				x, err := indexOf(f.ctx, f.store, f.config(2), 40, [2]int64{}, 1)
				if err != nil {
					f.t.Fatal(err)
				}
				b, err := x.Encode()
				if err != nil {
					f.t.Fatal(err)
				}
				f.put("corrupt", indexNameAt(15, 1, 99), []byte(strings.Replace(string(b), `"step":40`, `"step":15`, 1)))
				f.put("unnamed", logical.IndexPrefix+"notes.json", []byte("{}"))
				f.put("nested", logical.IndexPrefix+"dir/x.json", b) // not an index: it is not directly under the prefix
				f.save("p15", 2, 15, 1)                              // what the corrupt index may name
				f.index("i15", 2, 15, 1, -1)                         // a deleted index naming them too
				f.save("o15g2", 2, 15, 2)                            // not what it names
				f.put("garbage12", indexNameAt(12, 1, 99), []byte("}"))
				f.save("p12", 2, 12, 1) // what it may name, and no other index does
			},
			gone:    []string{"i10", "i10.s0", "i10.s1", "i15", "i20", "i20.s0", "i20.s1", "o15g2.s0", "o15g2.s1"},
			deleted: []string{"i10", "i15", "i20"},
		},
		{
			name: "a reshaped job's old parts go with their indexes", r: retention{keepLast: 2},
			setup: func(f *retainFixture) {
				f.save("o5", 4, 5, 1)
				f.saveIndexed(4, 10, 20)
				f.save("o25", 4, 25, 2)
				f.saveIndexed(2, 30, 40, 50)
			},
			gone: []string{"o5.s0", "o5.s1", "o5.s2", "o5.s3",
				"i10", "i10.s0", "i10.s1", "i10.s2", "i10.s3", "i20", "i20.s0", "i20.s1", "i20.s2", "i20.s3",
				"o25.s0", "o25.s1", "o25.s2", "o25.s3", "i30", "i30.s0", "i30.s1"},
			deleted: []string{"i10", "i20", "i30"},
		},
		{
			name: "nothing outside a stage's prefix is deleted", r: retention{keepLast: 1},
			setup: func(f *retainFixture) {
				f.saveIndexed(2, 10, 20)
				// A data-parallel checkpoint at the store's root, and
				// checkpoint-like objects elsewhere under pipeline/.
				f.put("root", "step-000000000001-g1-1/manifest.pb", []byte("x"))
				f.put("odd", "pipeline/p2-x/step-000000000001-g1-1/part-0", []byte("x"))
				f.put("deep", "pipeline/old/p2-s0/step-000000000001-g1-1/part-0", []byte("x"))
				// An old index naming the root checkpoint.
				f.write("foreign", &logical.Index{Format: 1, Step: 1, Generation: 1, Stages: 1,
					Parts: []logical.Part{{Stage: 0, Prefix: "", ID: "step-000000000001-g1-1"}, {Stage: 0, Prefix: "pipeline/p2-s0", ID: "/../step-000000000001-g1-1"}}})
			},
			gone:    []string{"foreign", "i10", "i10.s0", "i10.s1"},
			deleted: []string{"foreign", "i10"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			f := newRetainFixture(t, ctx)
			c.setup(f)
			for _, l := range f.labels {
				if !f.exists(l) {
					t.Fatalf("fixture: %s (%s) is not in the store", l, f.obj[l])
				}
			}
			for _, l := range append(slices.Clip(c.gone), c.deleted...) {
				if _, ok := f.obj[l]; !ok {
					t.Fatalf("test: no label %s", l)
				}
			}
			rec := &recordingStore{Store: f.store}
			names, err := c.r.retain(ctx, rec)
			if err != nil {
				t.Fatalf("retain: %v", err)
			}
			var got []string
			for _, n := range names {
				l, ok := f.label[n]
				if !ok {
					l = "?" + n
				}
				got = append(got, l)
			}
			if !slices.Equal(got, c.deleted) {
				t.Errorf("retain returned %q, want %q", got, c.deleted)
			}
			for _, l := range f.labels {
				want := !slices.Contains(c.gone, l)
				if got := f.exists(l); got != want {
					t.Errorf("%s (%s): in the store %v, want %v", l, f.obj[l], got, want)
				}
			}
			if c.r.keepLast <= 0 && rec.calls != 0 {
				t.Errorf("keepLast %d: %d store calls, want none", c.r.keepLast, rec.calls)
			}
			// A deleted index went before any of its parts.
			at := func(obj string) int {
				return slices.IndexFunc(rec.deletes, func(n string) bool { return n == obj || strings.HasPrefix(n, obj) && strings.HasSuffix(obj, "/") })
			}
			for ix, parts := range f.owns {
				i := at(f.obj[ix])
				for _, p := range parts {
					if j := at(f.obj[p]); j >= 0 && (i < 0 || j < i) {
						t.Errorf("part %s deleted (delete %d) before its index %s (delete %d)", p, j, ix, i)
					}
				}
			}
		})
	}
}

// A failed deletion stops retain, is returned wrapped with the name of
// what failed, and the indexes deleted until then are returned with it.
func TestRetainStopsAtAFailedDelete(t *testing.T) {
	for _, c := range []struct {
		name    string
		fail    func(f *retainFixture) string // the object whose Delete fails
		deleted []string
		gone    []string
	}{
		{
			name:    "an index",
			fail:    func(f *retainFixture) string { return f.obj["i20"] },
			deleted: []string{"i10"},
			gone:    []string{"i10", "i10.s0", "i10.s1"},
		},
		{
			name: "a part",
			fail: func(f *retainFixture) string {
				id := strings.TrimPrefix(f.obj["i20.s1"], "pipeline/p2-s1/")
				return "pipeline/p2-s1/" + id + checkpoint.ManifestName
			},
			deleted: []string{"i10", "i20"},
			gone:    []string{"i10", "i10.s0", "i10.s1", "i20", "i20.s0"},
		},
		{
			name:    "an orphan",
			fail:    func(f *retainFixture) string { return f.obj["o5.s0"] + checkpoint.ManifestName },
			deleted: []string{"i10", "i20", "i30"},
			gone: []string{"i10", "i10.s0", "i10.s1", "i20", "i20.s0", "i20.s1",
				"i30", "i30.s0", "i30.s1"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			f := newRetainFixture(t, ctx)
			f.save("o5", 2, 5, 1)
			f.saveIndexed(2, 10, 20, 30, 40, 50)
			fail := c.fail(f)
			names, err := retention{keepLast: 2}.retain(ctx, &recordingStore{Store: f.store, fail: fail})
			if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), strings.TrimSuffix(strings.TrimSuffix(fail, checkpoint.ManifestName), "/")) {
				t.Errorf("retain: %v, want the injected failure naming %s", err, fail)
			}
			var got []string
			for _, n := range names {
				got = append(got, f.label[n])
			}
			if !slices.Equal(got, c.deleted) {
				t.Errorf("retain returned %q, want %q", got, c.deleted)
			}
			for _, l := range f.labels {
				want := !slices.Contains(c.gone, l)
				if got := f.exists(l); got != want {
					t.Errorf("%s (%s): in the store %v, want %v", l, f.obj[l], got, want)
				}
			}
		})
	}
}

// An index gone between its listing and its reading is skipped; any other
// failure to read one stops retain before it deletes anything, since the
// parts of an index it cannot read would look like orphans.
func TestRetainReadErrors(t *testing.T) {
	for _, c := range []struct {
		name    string
		err     error
		wantErr bool
		deleted []string
		gone    []string
	}{
		{name: "vanished", err: fmt.Errorf("read: %w", checkpoint.ErrNotFound),
			deleted: []string{"i10", "i20"}, gone: []string{"i10", "i10.s0", "i10.s1", "i20", "i20.s0", "i20.s1"}},
		{name: "unreadable", err: errInjected, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			f := newRetainFixture(t, ctx)
			f.saveIndexed(2, 10, 20, 30, 40, 50)
			// The newest index cannot be read: when skipped, it is not
			// counted, and 30 and 40 are the newest two.
			names, err := retention{keepLast: 2}.retain(ctx, &recordingStore{Store: f.store, readErr: map[string]error{f.obj["i50"]: c.err}})
			if c.wantErr != (err != nil) || err != nil && (!errors.Is(err, c.err) || !strings.Contains(err.Error(), f.obj["i50"])) {
				t.Errorf("retain: %v, want an error %v naming %s", err, c.wantErr, f.obj["i50"])
			}
			var got []string
			for _, n := range names {
				got = append(got, f.label[n])
			}
			if !slices.Equal(got, c.deleted) {
				t.Errorf("retain returned %q, want %q", got, c.deleted)
			}
			for _, l := range f.labels {
				want := !slices.Contains(c.gone, l)
				if got := f.exists(l); got != want {
					t.Errorf("%s (%s): in the store %v, want %v", l, f.obj[l], got, want)
				}
			}
		})
	}
}
