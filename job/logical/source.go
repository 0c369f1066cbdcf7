package logical

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/tp"
)

// Source is one verified checkpoint read as logical tensors: an index of
// parts (Kind "pipeline"), or a ring's checkpoint (Kind "ring"), seen as
// an index of one part holding every tensor whole.
type Source struct {
	Index *Index
	Kind  string // "pipeline" or "ring": the format that holds it
	ID    string // the index's object name, or the ring checkpoint's ID

	parts   []partOf
	tensors map[string]logicalTensor // by name, from index()
	// scratch, grown as needed
	logical, src []float32
}

type partOf struct {
	store checkpoint.Store
	m     *phalanxpb.Manifest
}

// logicalTensor is where a tensor of the source lies.
type logicalTensor struct {
	shape  []int
	layout *Layout // cut across every part; nil: whole in part
	part   int
	role   string
}

// Manifest is part i's verified manifest.
func (s *Source) Manifest(i int) *phalanxpb.Manifest { return s.parts[i].m }

// Parts is the number of parts.
func (s *Source) Parts() int { return len(s.parts) }

// index finds every tensor's part and logical shape.
func (s *Source) index() error {
	x := s.Index
	if len(s.parts) != len(x.Parts) || (x.Split != nil && len(s.parts) != x.Stages) {
		return fmt.Errorf("%s checkpoint %s names %d parts for %d ranks", s.Kind, s.ID, len(x.Parts), x.Stages)
	}
	s.tensors = map[string]logicalTensor{}
	for i, p := range s.parts {
		for _, t := range p.m.Tensors {
			if _, seen := s.tensors[t.Name]; seen {
				continue
			}
			lt := logicalTensor{part: i, role: t.Role}
			for _, d := range t.Shape {
				lt.shape = append(lt.shape, int(d))
			}
			if lay, ok := x.Split[paramOf(t.Name)]; ok {
				l := lay
				if err := l.check(); err != nil {
					return fmt.Errorf("%s checkpoint %s: tensor %s: %w", s.Kind, s.ID, t.Name, err)
				}
				lt.shape, lt.layout = l.Shape, &l
			}
			s.tensors[t.Name] = lt
		}
	}
	return nil
}

// check refuses a layout that cuts no axis of its shape into equal blocks.
func (l Layout) check() error {
	if l.Axis < 0 || l.Axis >= len(l.Shape) || l.Blocks < 1 || l.Shape[l.Axis]%l.Blocks != 0 {
		return fmt.Errorf("cut %d blocks along axis %d of %v: not a layout", l.Blocks, l.Axis, l.Shape)
	}
	return nil
}

// at is the slice of the tensor laid out as l that rank of size holds.
func (l Layout) at(size, rank int) tp.Slice {
	return tp.Slice{Shape: l.Shape, Axis: l.Axis, Blocks: l.Blocks, Ranges: tp.BlockRanges(l.Shape[l.Axis], l.Blocks, size, rank)}
}

// paramOf is the parameter a tensor's name belongs to: an optimizer
// slot, param/kind, is its parameter's.
func paramOf(name string) string {
	p, _, _ := strings.Cut(name, "/")
	return p
}

// Shape is tensor name's logical shape, and whether the source has it.
func (s *Source) Shape(name string) ([]int, bool) {
	t, ok := s.tensors[name]
	return t.shape, ok
}

// Names are the source's tensors, sorted.
func (s *Source) Names() []string { return slices.Sorted(maps.Keys(s.tensors)) }

// lookup is tensor name, which must have shape.
func (s *Source) lookup(name string, shape []int) (logicalTensor, error) {
	t, ok := s.tensors[name]
	switch {
	case !ok:
		return t, &checkpoint.IncompatibleError{ID: s.ID, Reason: fmt.Sprintf("it has no tensor %q", name)}
	case !slices.Equal(t.shape, shape):
		return t, &checkpoint.IncompatibleError{ID: s.ID, Reason: fmt.Sprintf("tensor %s is %v there, %v here", name, t.shape, shape)}
	}
	return t, nil
}

// Read loads the whole of tensor name, of logical shape shape, into dst:
// from the part holding it, or assembled from every part's slice.
func (s *Source) Read(ctx context.Context, name string, shape []int, dst []float32) error {
	t, err := s.lookup(name, shape)
	if err != nil {
		return err
	}
	if n := numel(shape); len(dst) != n {
		return fmt.Errorf("logical: reading %s (%d values) into %d", name, n, len(dst))
	}
	if t.layout == nil {
		p := s.parts[t.part]
		return checkpoint.ReadTensor(ctx, p.store, p.m, name, dst)
	}
	for q, p := range s.parts {
		sl := t.layout.at(len(s.parts), q)
		s.src = grow(s.src, sl.Len())
		if err := checkpoint.ReadTensor(ctx, p.store, p.m, name, s.src); err != nil {
			return err
		}
		sl.Put(s.src, dst)
	}
	return nil
}

// ReadSlice loads into dst the slice here of tensor name (a parameter's,
// or one of its optimizer slots, cut as it is): when the source holds the
// tensor cut alike, only the parts that hold some of the slice are read
// (just this rank's own with the same number of ranks); otherwise the
// logical tensor is read and the slice taken from it.
func (s *Source) ReadSlice(ctx context.Context, name string, here tp.Slice, dst []float32) error {
	if !here.Split() {
		return s.Read(ctx, name, here.Shape, dst)
	}
	t, err := s.lookup(name, here.Shape)
	if err != nil {
		return err
	}
	if len(dst) != here.Len() {
		return fmt.Errorf("logical: reading a slice of %d values of %s into %d", here.Len(), name, len(dst))
	}
	cutAlike := t.layout != nil && t.layout.Axis == here.Axis && t.layout.Blocks == here.Blocks
	s.logical = grow(s.logical, numel(here.Shape))
	for q, p := range s.parts {
		if !cutAlike {
			break
		}
		old := t.layout.at(len(s.parts), q)
		if slices.Equal(old.Ranges, here.Ranges) { // the same slice: this rank's own part
			return checkpoint.ReadTensor(ctx, p.store, p.m, name, dst)
		}
		if !overlaps(old.Ranges, here.Ranges) {
			continue // none of this rank's values: not read
		}
		s.src = grow(s.src, old.Len())
		if err := checkpoint.ReadTensor(ctx, p.store, p.m, name, s.src); err != nil {
			return err
		}
		old.Put(s.src, s.logical)
	}
	if !cutAlike {
		if err := s.Read(ctx, name, here.Shape, s.logical); err != nil {
			return err
		}
	}
	here.Take(s.logical, dst)
	return nil
}

// Check refuses a source that does not hold the state tensors need: each
// by name with its logical shape, and the same optimizer (its slots'
// kinds, param/kind, the same as the source's, once tensors has any
// parameter).
func (s *Source) Check(tensors []checkpoint.Tensor, shapes [][]int) error {
	mine, theirs := map[string]bool{}, map[string]bool{}
	params := false
	for _, t := range tensors {
		if t.Role == "optimizer" {
			mine[slotKind(t.Name)] = true
		}
		params = params || t.Role == "parameter"
	}
	for n, t := range s.tensors {
		if t.role == "optimizer" {
			theirs[slotKind(n)] = true
		}
	}
	if params && !maps.Equal(mine, theirs) {
		return &checkpoint.IncompatibleError{ID: s.ID, Reason: fmt.Sprintf("its optimizer keeps slots %v, this job's %v", slices.Sorted(maps.Keys(theirs)), slices.Sorted(maps.Keys(mine)))}
	}
	for i, t := range tensors {
		if _, err := s.lookup(t.Name, shapes[i]); err != nil {
			return err
		}
	}
	return nil
}

// Load checks the source against tensors (Check) and loads each: whole,
// of its logical shape, or, where slices is given, the rank's slice
// slices[i] of it.
func (s *Source) Load(ctx context.Context, tensors []checkpoint.Tensor, shapes [][]int, slices []tp.Slice) error {
	if err := s.Check(tensors, shapes); err != nil {
		return err
	}
	for i, t := range tensors {
		var err error
		if slices != nil {
			err = s.ReadSlice(ctx, t.Name, slices[i], t.Data)
		} else {
			err = s.Read(ctx, t.Name, shapes[i], t.Data)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Shapes are tensors' own shapes as a whole tensor's logical shapes.
func Shapes(tensors []checkpoint.Tensor) [][]int {
	shapes := make([][]int, len(tensors))
	for i, t := range tensors {
		for _, d := range t.Shape {
			shapes[i] = append(shapes[i], int(d))
		}
	}
	return shapes
}

func slotKind(name string) string {
	_, k, _ := strings.Cut(name, "/")
	return k
}

// OpenRing is the ring checkpoint m of store, verified wholly.
func OpenRing(ctx context.Context, store checkpoint.Store, m *phalanxpb.Manifest) (*Source, error) {
	if err := checkpoint.Verify(ctx, store, m); err != nil {
		return nil, err
	}
	return RingSource(store, m)
}

// RingSource is the ring checkpoint m of store, not verified beforehand:
// each read checks what it reads (checkpoint.ReadTensor).
func RingSource(store checkpoint.Store, m *phalanxpb.Manifest) (*Source, error) {
	x := &Index{Format: 1, Step: m.Step, Epoch: m.Epoch, Offset: m.Offset, Generation: m.Generation, Stages: 1,
		Parts: []Part{{Prefix: "", ID: m.Id}}, name: m.Id}
	for _, t := range m.Tensors {
		x.Parts[0].Tensors = append(x.Parts[0].Tensors, t.Name)
	}
	src := &Source{Index: x, Kind: "ring", ID: m.Id, parts: []partOf{{store: store, m: m}}}
	return src, src.index()
}

// Model is what a ring checkpoint's manifest says of the state's
// meaning: the model, its options and the seed.
type Model struct {
	Name    string
	Options map[string]string
	Seed    uint64
}

// NewestRing is the store's newest complete ring checkpoint that
// verifies, of model (nil: of any); nil when there is none. Checkpoints
// that do not verify are skipped (said through skip); one of another
// model is an error: the store is another model's.
func NewestRing(ctx context.Context, store checkpoint.Store, model *Model, skip func(id string, err error)) (*Source, error) {
	return newestRing(ctx, store, model, skip, -1)
}

// newestRing is NewestRing among the checkpoints of steps after after
// (none later: nil, and nothing else read).
func newestRing(ctx context.Context, store checkpoint.Store, model *Model, skip func(id string, err error), after int64) (*Source, error) {
	infos, err := checkpoint.List(ctx, store)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: listing %s: %w", store.Location(), err)
	}
	for _, in := range infos {
		if in.Step <= after {
			break // newest first: none later
		}
		if !in.Complete {
			continue
		}
		m, err := checkpoint.ReadManifest(ctx, store, in.ID)
		if err == nil && model != nil && (m.Model != model.Name || m.Seed != model.Seed || !maps.Equal(m.ModelOptions, model.Options)) {
			return nil, &checkpoint.IncompatibleError{ID: in.ID, Reason: fmt.Sprintf("it holds the state of model %q (options %v, seed %d), this job's is %q (options %v, seed %d): give this job another --checkpoint location",
				m.Model, m.ModelOptions, m.Seed, model.Name, model.Options, model.Seed)}
		}
		var src *Source
		if err == nil {
			src, err = OpenRing(ctx, store, m)
		}
		if err != nil {
			skip(in.ID, err)
			continue
		}
		return src, nil
	}
	return nil, nil
}

// overlaps reports whether any range of a meets any of b.
func overlaps(a, b [][2]int) bool {
	for _, x := range a {
		for _, y := range b {
			if x[0] < y[1] && y[0] < x[1] {
				return true
			}
		}
	}
	return false
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
