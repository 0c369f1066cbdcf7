package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Info describes a checkpoint found in a store.
type Info struct {
	ID       string
	Step     int64
	Complete bool      // its manifest exists
	Bytes    int64     // stored, manifest included
	Objects  int       // stored objects, manifest included
	Modified time.Time // of its newest object
}

// List returns the store's checkpoints, complete or not, newest first (by
// step, then by time).
func List(ctx context.Context, s Store) ([]Info, error) {
	objs, err := s.List(ctx, "step-")
	if err != nil {
		return nil, err
	}
	byID := map[string]*Info{}
	for _, o := range objs {
		id, rest, ok := strings.Cut(o.Name, "/")
		if !ok || strings.Contains(rest, "/") {
			continue
		}
		step, ok := parseID(id)
		if !ok {
			continue
		}
		in := byID[id]
		if in == nil {
			in = &Info{ID: id, Step: step}
			byID[id] = in
		}
		in.Bytes += o.Size
		in.Objects++
		if o.Modified.After(in.Modified) {
			in.Modified = o.Modified
		}
		if rest == ManifestName {
			in.Complete = true
		}
	}
	out := make([]Info, 0, len(byID))
	for _, in := range byID {
		out = append(out, *in)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Step != out[j].Step {
			return out[i].Step > out[j].Step
		}
		if !out[i].Modified.Equal(out[j].Modified) {
			return out[i].Modified.After(out[j].Modified)
		}
		return out[i].ID > out[j].ID
	})
	return out, nil
}

// ReadManifest reads and checks the manifest of checkpoint id.
func ReadManifest(ctx context.Context, s Store, id string) (*phalanxpb.Manifest, error) {
	buf, err := readSmall(ctx, s, id+"/"+ManifestName)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: manifest: %w", id, err)
	}
	return DecodeManifest(id, buf)
}

// readSmall reads a whole object of at most maxManifestBytes.
func readSmall(ctx context.Context, s Store, name string) ([]byte, error) {
	objs, err := s.List(ctx, name)
	if err != nil {
		return nil, err
	}
	var size int64 = -1
	for _, o := range objs {
		if o.Name == name {
			size = o.Size
		}
	}
	switch {
	case size < 0:
		return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
	case size > maxManifestBytes:
		return nil, fmt.Errorf("%s: %d bytes, more than the %d allowed", name, size, maxManifestBytes)
	}
	buf := make([]byte, size)
	if err := s.ReadAt(ctx, name, buf, 0); err != nil {
		return nil, err
	}
	return buf, nil
}

// CorruptError is a checkpoint whose stored bytes do not match its
// manifest.
type CorruptError struct {
	ID     string
	Object string
	What   string // "block 3 (bytes [3145728,4194304))", "tensor fc1/w", "object"
	Reason string // "checksum 1a2b3c4d, want 5e6f7a8b", a read error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("checkpoint %s: %s of %s: %s", e.ID, e.What, e.Object, e.Reason)
}

// readRange reads stream bytes [lo, hi) of m into dst from the objects
// holding them, up to 4 objects at once.
func readRange(ctx context.Context, s Store, m *phalanxpb.Manifest, lo, hi int64, dst []byte, b Backoff) error {
	var wg sync.WaitGroup
	errs := make([]error, len(m.Objects))
	sem := make(chan struct{}, 4)
	for i, o := range m.Objects {
		a, z := max(lo, int64(o.Offset)), min(hi, int64(o.Offset+o.Bytes))
		if a >= z {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			name := m.Id + "/" + o.Name
			err := b.do(ctx, func(ctx context.Context) error {
				return s.ReadAt(ctx, name, dst[a-lo:z-lo], a-int64(o.Offset))
			}, nil)
			if err != nil {
				errs[i] = &CorruptError{ID: m.Id, Object: o.Name, What: fmt.Sprintf("bytes [%d,%d)", a-int64(o.Offset), z-int64(o.Offset)), Reason: err.Error()}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// verifyBlocks checks the blocks of stream range [lo, hi) (block-aligned but
// for the state's end) held in buf.
func verifyBlocks(m *phalanxpb.Manifest, lo, hi int64, buf []byte) error {
	bs := int64(m.BlockBytes)
	for b := lo / bs; b*bs < hi; b++ {
		a, z := b*bs, min((b+1)*bs, int64(m.TotalBytes))
		if got, want := crc(buf[a-lo:z-lo]), m.BlockCrc32C[b]; got != want {
			return &CorruptError{ID: m.Id, Object: objectAt(m, a), What: fmt.Sprintf("block %d (state bytes [%d,%d))", b, a, z),
				Reason: fmt.Sprintf("checksum %08x, want %08x", got, want)}
		}
	}
	return nil
}

func objectAt(m *phalanxpb.Manifest, at int64) string {
	for _, o := range m.Objects {
		if uint64(at) >= o.Offset && uint64(at) < o.Offset+o.Bytes {
			return o.Name
		}
	}
	return "?"
}

// Verify reads every object of checkpoint m and checks every checksum: of
// each object, block and tensor segment.
func Verify(ctx context.Context, s Store, m *phalanxpb.Manifest) error {
	for _, o := range m.Objects {
		buf := make([]byte, o.Bytes)
		if err := readRange(ctx, s, m, int64(o.Offset), int64(o.Offset+o.Bytes), buf, Backoff{First: 100 * time.Millisecond, Max: time.Second}); err != nil {
			return err
		}
		if got := crc(buf); got != o.Crc32C {
			return &CorruptError{ID: m.Id, Object: o.Name, What: "object", Reason: fmt.Sprintf("checksum %08x, want %08x", got, o.Crc32C)}
		}
		if err := verifyBlocks(m, int64(o.Offset), int64(o.Offset+o.Bytes), buf); err != nil {
			return err
		}
		for _, t := range m.Tensors {
			for _, s := range t.Segments {
				if m.Objects[s.Object] != o {
					continue
				}
				if got := crc(buf[s.Offset : s.Offset+s.Bytes]); got != s.Crc32C {
					return &CorruptError{ID: m.Id, Object: o.Name, What: fmt.Sprintf("tensor %s (bytes [%d,+%d) of the object)", t.Name, s.Offset, s.Bytes),
						Reason: fmt.Sprintf("checksum %08x, want %08x", got, s.Crc32C)}
				}
			}
		}
	}
	return nil
}

// Remove deletes checkpoint id: its manifest first, so that it stops
// existing at once, then its other objects.
func Remove(ctx context.Context, s Store, id string) error {
	if _, ok := parseID(id); !ok {
		return fmt.Errorf("checkpoint: %q is not a checkpoint name", id)
	}
	if err := s.Delete(ctx, id+"/"+ManifestName); err != nil {
		return err
	}
	objs, err := s.List(ctx, id+"/")
	if err != nil {
		return err
	}
	for _, o := range objs {
		if err := s.Delete(ctx, o.Name); err != nil {
			return err
		}
	}
	return nil
}

// Retention says which checkpoints to keep: the newest KeepLast complete
// ones, and every checkpoint whose sequence number is a multiple of
// KeepEvery. KeepLast 0 keeps everything.
type Retention struct {
	KeepLast  int
	KeepEvery int
}

// Plan returns the checkpoints Retain would delete: complete ones beyond
// the policy, and incomplete ones older than the newest complete one (left
// by failed or abandoned uploads; newer ones may still be in flight).
func (r Retention) Plan(ctx context.Context, s Store) ([]Info, error) {
	all, err := List(ctx, s)
	if err != nil {
		return nil, err
	}
	var out []Info
	kept, newestComplete := 0, int64(-1)
	for _, in := range all {
		if in.Complete {
			if newestComplete < 0 {
				newestComplete = in.Step
			}
			kept++
			if r.KeepLast <= 0 || kept <= r.KeepLast {
				continue
			}
			if r.KeepEvery > 0 {
				m, err := ReadManifest(ctx, s, in.ID)
				if err == nil && m.Sequence%uint64(r.KeepEvery) == 0 {
					continue
				}
			}
			out = append(out, in)
		} else if newestComplete >= 0 && in.Step < newestComplete {
			out = append(out, in)
		}
	}
	return out, nil
}

// Retain deletes what Plan returns and reports the names deleted.
func (r Retention) Retain(ctx context.Context, s Store) ([]string, error) {
	plan, err := r.Plan(ctx, s)
	if err != nil {
		return nil, err
	}
	var done []string
	for _, in := range plan {
		if err := Remove(ctx, s, in.ID); err != nil {
			return done, err
		}
		done = append(done, in.ID)
	}
	return done, nil
}
