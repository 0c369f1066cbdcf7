package logical

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/tp"
)

// state is a small model's logical state: W [4,6] cut by columns in two
// blocks (as a fused projection is), its Adam slots cut alike, b [6]
// whole.
type state struct {
	names  []string
	roles  []string
	shapes [][]int
	data   [][]float32
	layout Layout // W's and its slots'
}

func newState() *state {
	s := &state{layout: Layout{Shape: []int{4, 6}, Axis: 1, Blocks: 2}}
	for _, t := range []struct {
		name, role string
		shape      []int
	}{{"W", "parameter", []int{4, 6}}, {"b", "parameter", []int{6}}, {"W/m", "optimizer", []int{4, 6}}, {"b/m", "optimizer", []int{6}}} {
		d := make([]float32, numel(t.shape))
		for i := range d {
			d[i] = float32(len(s.names)*100 + i)
		}
		s.names, s.roles, s.shapes, s.data = append(s.names, t.name), append(s.roles, t.role), append(s.shapes, t.shape), append(s.data, d)
	}
	return s
}

// slice is tensor i's slice at rank of size (whole for b and b/m).
func (s *state) slice(i, size, rank int) tp.Slice {
	if strings.HasPrefix(s.names[i], "b") {
		return tp.Slice{Shape: s.shapes[i]}
	}
	return s.layout.at(size, rank)
}

func (s *state) tensors(size, rank int) []checkpoint.Tensor {
	var out []checkpoint.Tensor
	for i := range s.names {
		sl := s.slice(i, size, rank)
		d := make([]float32, sl.Len())
		sl.Take(s.data[i], d)
		out = append(out, checkpoint.Tensor{Name: s.names[i], Role: s.roles[i], Shape: shape64(sl, s.shapes[i]), Data: d})
	}
	return out
}

// shape64 is a slice's local shape: the cut axis as wide as its ranges.
func shape64(sl tp.Slice, shape []int) []int64 {
	out := make([]int64, len(shape))
	for i, d := range shape {
		out[i] = int64(d)
	}
	if sl.Split() {
		w := 0
		for _, r := range sl.Ranges {
			w += r[1] - r[0]
		}
		out[sl.Axis] = int64(w)
	}
	return out
}

func save(t *testing.T, ctx context.Context, store checkpoint.Store, ts []checkpoint.Tensor, model string, step int64) string {
	t.Helper()
	ck, err := checkpoint.New(checkpoint.Config{Store: store, Job: "logical-test", Model: model, Seed: 7, Wait: time.Minute}, ts)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close(ctx)
	id, err := ck.SaveAlone(ctx, checkpoint.Progress{Step: step, Epoch: 1, Offset: 16}, 3)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// saveIndexed stores s as written by size tensor-parallel ranks, and its
// index.
func saveIndexed(t *testing.T, ctx context.Context, store checkpoint.Store, s *state, size int, step int64) string {
	t.Helper()
	x := &Index{Format: 1, Step: step, Epoch: 1, Offset: 16, Generation: 3, StateHash: "h", Stages: size, Split: map[string]Layout{"W": s.layout}}
	for r := range size {
		prefix := fmt.Sprintf("pipeline/p%d-s%d/", size, r)
		id := save(t, ctx, checkpoint.Prefixed(store, prefix), s.tensors(size, r), "m", step)
		x.Parts = append(x.Parts, Part{Stage: r, Prefix: prefix, ID: id, Tensors: s.names})
	}
	name, err := WriteIndex(ctx, store, x)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func newStore(t *testing.T) (checkpoint.Store, string) {
	t.Helper()
	dir := t.TempDir()
	store, err := checkpoint.NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return store, dir
}

// Every tensor, and every rank's slice of it at 1 to 4 ranks, read from a
// ring checkpoint and from indexes written by 1 to 3 ranks, equals the
// logical state's.
func TestReadAcrossLayouts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newState()
	type source struct {
		name string
		open func(t *testing.T, store checkpoint.Store) *Source
	}
	sources := []source{{"ring", func(t *testing.T, store checkpoint.Store) *Source {
		save(t, ctx, store, s.tensors(1, 0), "m", 5)
		src, err := NewestRing(ctx, store, &Model{Name: "m", Seed: 7}, func(id string, err error) { t.Errorf("skipped %s: %v", id, err) })
		if err != nil || src == nil {
			t.Fatalf("newest ring checkpoint: %v, %v", src, err)
		}
		return src
	}}}
	for size := 1; size <= 3; size++ {
		sources = append(sources, source{fmt.Sprintf("index of %d parts", size), func(t *testing.T, store checkpoint.Store) *Source {
			saveIndexed(t, ctx, store, s, size, 5)
			src, err := NewestIndex(ctx, store, "h", func(id string, err error) { t.Errorf("skipped %s: %v", id, err) })
			if err != nil || src == nil {
				t.Fatalf("newest index: %v, %v", src, err)
			}
			return src
		}})
	}
	for _, sc := range sources {
		t.Run(sc.name, func(t *testing.T) {
			store, _ := newStore(t)
			src := sc.open(t, store)
			if x := src.Index; x.Step != 5 || x.Epoch != 1 || x.Offset != 16 {
				t.Errorf("position: step %d epoch %d offset %d, want 5, 1, 16", x.Step, x.Epoch, x.Offset)
			}
			if err := src.Check(s.tensors(1, 0), s.shapes); err != nil {
				t.Errorf("check: %v", err)
			}
			for i, name := range s.names {
				got := make([]float32, len(s.data[i]))
				if err := src.Read(ctx, name, s.shapes[i], got); err != nil || !slices.Equal(got, s.data[i]) {
					t.Errorf("%s read whole: %v (%v), want %v", name, got, err, s.data[i])
				}
				for size := 1; size <= 4; size++ {
					for rank := range size {
						sl := s.slice(i, size, rank)
						want := make([]float32, sl.Len())
						sl.Take(s.data[i], want)
						got := make([]float32, sl.Len())
						if err := src.ReadSlice(ctx, name, sl, got); err != nil || !slices.Equal(got, want) {
							t.Errorf("%s at rank %d of %d: %v (%v), want %v", name, rank, size, got, err, want)
						}
					}
				}
			}
		})
	}
}

// A source that does not hold what a job needs is refused naming the
// tensor, the shapes or the optimizers.
func TestCheckRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, _ := newStore(t)
	s := newState()
	saveIndexed(t, ctx, store, s, 2, 5)
	src, err := NewestIndex(ctx, store, "h", func(string, error) {})
	if err != nil {
		t.Fatal(err)
	}
	ts, shapes := s.tensors(1, 0), s.shapes
	for _, tc := range []struct {
		name   string
		mutate func(ts []checkpoint.Tensor, shapes [][]int) ([]checkpoint.Tensor, [][]int)
		want   string
	}{
		{"a tensor it lacks", func(ts []checkpoint.Tensor, sh [][]int) ([]checkpoint.Tensor, [][]int) {
			ts[1].Name = "c"
			return ts, sh
		}, `no tensor "c"`},
		{"another shape", func(ts []checkpoint.Tensor, sh [][]int) ([]checkpoint.Tensor, [][]int) {
			sh[0] = []int{6, 4}
			return ts, sh
		}, "tensor W is [4 6] there, [6 4] here"},
		{"another optimizer", func(ts []checkpoint.Tensor, sh [][]int) ([]checkpoint.Tensor, [][]int) {
			return ts[:2], sh[:2] // plain SGD keeps no slots
		}, "its optimizer keeps slots [m], this job's []"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, sh := tc.mutate(slices.Clone(ts), slices.Clone(shapes))
			err := src.Check(ts, sh)
			var ie *checkpoint.IncompatibleError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("check: %v, want an IncompatibleError saying %q", err, tc.want)
			}
		})
	}
}

// A ring checkpoint of another model is refused; one whose shard is
// corrupt is skipped for an older one; an index whose part is corrupt
// does not open, and names the part.
func TestDamagedAndForeign(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := newState()
	t.Run("another model", func(t *testing.T) {
		store, _ := newStore(t)
		save(t, ctx, store, s.tensors(1, 0), "other", 5)
		_, err := NewestRing(ctx, store, &Model{Name: "m", Seed: 7}, func(string, error) {})
		if err == nil || !strings.Contains(err.Error(), `model "other"`) {
			t.Errorf("another model's checkpoint: %v, want it refused naming the model", err)
		}
	})
	t.Run("a corrupt ring shard", func(t *testing.T) {
		store, dir := newStore(t)
		old := save(t, ctx, store, s.tensors(1, 0), "m", 5)
		bad := save(t, ctx, store, s.tensors(1, 0), "m", 6)
		corrupt(t, filepath.Join(dir, bad))
		var skipped []string
		src, err := NewestRing(ctx, store, &Model{Name: "m", Seed: 7}, func(id string, err error) { skipped = append(skipped, id) })
		if err != nil || src == nil || src.ID != old || !slices.Equal(skipped, []string{bad}) {
			t.Errorf("resumed %v (%v), skipped %v; want %s, skipping %s", src, err, skipped, old, bad)
		}
	})
	t.Run("a corrupt part", func(t *testing.T) {
		store, dir := newStore(t)
		name := saveIndexed(t, ctx, store, s, 2, 5)
		parts, _ := filepath.Glob(filepath.Join(dir, "pipeline", "p2-s1", "step-*"))
		if len(parts) != 1 {
			t.Fatalf("parts of stage 1: %v", parts)
		}
		corrupt(t, parts[0])
		_, err := OpenIndex(ctx, store, name)
		if err == nil || !strings.Contains(err.Error(), filepath.Base(parts[0])) {
			t.Errorf("an index whose part is corrupt: %v, want an error naming %s", err, filepath.Base(parts[0]))
		}
		// Unverified, it opens; the read of the damaged tensor fails,
		// naming it.
		src, err := IndexSource(ctx, store, name)
		if err != nil {
			t.Fatal(err)
		}
		var bad []string
		for i, n := range s.names {
			if err := src.Read(ctx, n, s.shapes[i], make([]float32, len(s.data[i]))); err != nil {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("reading %s: %v, want the tensor named", n, err)
				}
				bad = append(bad, n)
			}
		}
		if len(bad) == 0 {
			t.Error("every tensor of an index whose part is corrupt read without an error")
		}
	})
}

// corrupt flips a byte of every shard object in a checkpoint's directory.
func corrupt(t *testing.T, dir string) {
	t.Helper()
	shards, _ := filepath.Glob(filepath.Join(dir, "shard-*"))
	n := 0
	for _, p := range shards {
		if strings.HasSuffix(p, ".idx") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %v", p, err)
		}
		b[len(b)/2] ^= 0x5a
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no shard in %s", dir)
	}
}

// An index changed by one byte is refused by its own checksum.
func TestIndexChecksum(t *testing.T) {
	x := &Index{Format: 1, Step: 40, Epoch: 1, Offset: 64, StateHash: "abc", Stages: 2, Cuts: []int{4},
		Parts: []Part{{Stage: 0, Prefix: "pipeline/p2-s0/", ID: "step-000000000040-g1-1", Tensors: []string{"fc0.W"}}}}
	b, err := x.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if y, err := DecodeIndex("i", b); err != nil || y.Step != 40 || y.Parts[0].Tensors[0] != "fc0.W" {
		t.Fatalf("decoded %+v, %v", y, err)
	}
	bad := []byte(strings.Replace(string(b), `"step":40`, `"step":41`, 1))
	if _, err := DecodeIndex("i", bad); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("a changed index: %v, want it refused as corrupt", err)
	}
}
