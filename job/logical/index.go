// Package logical is a model's checkpointed state read as logical
// (unsplit) tensors by name, whichever job kind wrote it: a ring's single
// checkpoint, or an index of parts, the checkpoint of a model whose state
// several processes hold (pipeline stages, tensor-parallel ranks), each
// part a checkpoint of package checkpoint and the index, written last,
// tying them. A job resumes from a checkpoint of the same model written by
// another kind or another split of it: each process reads its own
// tensors, or its slices of them, by name.
package logical

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
)

// Index ties the parts of one step's checkpoint. Stored as JSON at
// IndexPrefix + step-<step>-g<generation>-<time>.json.
type Index struct {
	Format     int     `json:"format"`
	Step       int64   `json:"step"`
	Epoch      int64   `json:"epoch"`
	Offset     int64   `json:"offset"`
	Generation uint64  `json:"generation"`
	StateHash  string  `json:"state_hash"`
	Stages     int     `json:"stages"`
	Cuts       []int   `json:"cuts"`
	Parts      []Part  `json:"parts"`
	Loss       float64 `json:"loss"`
	// Split: a split model's parameters by name, how each is cut across
	// the Stages tensor-parallel ranks that wrote the parts (their
	// optimizer slots, named param/kind, are cut alike); a parameter
	// absent is whole in every part that names it.
	Split map[string]Layout `json:"split,omitempty"`
	CRC   uint32            `json:"crc32c"` // of the JSON with this field 0
	name  string            // its object's name, when read
}

// Layout is how a logical tensor is cut: its shape, the axis cut, and
// the equal blocks of that axis each shared out across the ranks
// (tp.BlockRanges).
type Layout struct {
	Shape  []int `json:"shape"`
	Axis   int   `json:"axis"`
	Blocks int   `json:"blocks"`
}

// Part is one process's checkpoint in an index.
type Part struct {
	Stage   int      `json:"stage"`
	Prefix  string   `json:"prefix"`
	ID      string   `json:"id"` // its manifest checks itself
	Tensors []string `json:"tensors"`
}

// IndexPrefix begins every index's object name.
const IndexPrefix = "pipeline/index-"

// maxIndexBytes bounds an index read.
const maxIndexBytes = 64 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Name is the index's object name, when it was read from a store.
func (x *Index) Name() string { return x.name }

// Encode is the index as stored, its checksum set.
func (x *Index) Encode() ([]byte, error) {
	x.CRC = 0
	b, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	x.CRC = crc32.Checksum(b, castagnoli)
	return json.Marshal(x)
}

// DecodeIndex reads an index stored as name, checking its checksum.
func DecodeIndex(name string, b []byte) (*Index, error) {
	var x Index
	if err := json.Unmarshal(b, &x); err != nil {
		return nil, fmt.Errorf("pipeline checkpoint %s: %w", name, err)
	}
	want := x.CRC
	x.CRC = 0
	plain, _ := json.Marshal(&x)
	if got := crc32.Checksum(plain, castagnoli); got != want || x.Format != 1 {
		return nil, fmt.Errorf("pipeline checkpoint %s: checksum %08x, want %08x (format %d): corrupt", name, got, want, x.Format)
	}
	x.CRC, x.name = want, name
	return &x, nil
}

// ReadIndex reads and decodes the index object o; ok is false, with no
// error, when it was read but does not decode (or is too big to be an
// index, and is not read).
func ReadIndex(ctx context.Context, store checkpoint.Store, o checkpoint.ObjectInfo) (x *Index, ok bool, err error) {
	if o.Size < 0 || o.Size > maxIndexBytes {
		return nil, false, nil
	}
	b := make([]byte, o.Size)
	if err := store.ReadAt(ctx, o.Name, b, 0); err != nil {
		return nil, false, err
	}
	x, err = DecodeIndex(o.Name, b)
	return x, err == nil, nil
}

// WriteIndex stores x under a new name, which it returns.
func WriteIndex(ctx context.Context, store checkpoint.Store, x *Index) (string, error) {
	b, err := x.Encode()
	if err != nil {
		return "", err
	}
	// The generation is padded so that names sort by it at one step (a
	// step trained again after a rollback is indexed again).
	name := fmt.Sprintf("%sstep-%012d-g%012d-%x.json", IndexPrefix, x.Step, x.Generation, uint64(time.Now().UnixNano()))
	return name, store.Put(ctx, name, b)
}

// StateHash identifies what gives an index's state its meaning: the
// model and its options, the optimizer's kind and the seed (not the cuts,
// replicas or schedule: a checkpoint resumes under others).
func StateHash(model string, options map[string]string, optimizer string, seed uint64) string {
	b, _ := json.Marshal(struct {
		Model     string
		Options   map[string]string
		Optimizer string
		Seed      uint64
	}{model, options, optimizer, seed})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:6])
}

// Newest is the store's newest checkpoint whose every part verifies, in
// either format: the newest index of state hash hash, or the newest ring
// checkpoint of model when its step is later ("" and nil: of any state,
// of any model); nil when there is none. What does not verify is skipped,
// said through skip; a checkpoint of another state or model is an error.
func Newest(ctx context.Context, store checkpoint.Store, hash string, model *Model, skip func(name string, err error)) (*Source, error) {
	x, err := NewestIndex(ctx, store, hash, skip)
	if err != nil {
		return nil, err
	}
	after := int64(-1)
	if x != nil {
		after = x.Index.Step
	}
	r, err := newestRing(ctx, store, model, skip, after) // only those later than the index are read
	if err != nil || r != nil {
		return r, err
	}
	return x, nil
}

// IndexNames are the names of the store's index objects, oldest first
// (names sort by step, then generation, then time).
func IndexNames(ctx context.Context, store checkpoint.Store) ([]string, error) {
	objs, err := store.List(ctx, IndexPrefix)
	if err != nil {
		return nil, fmt.Errorf("pipeline checkpoints: %w", err)
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		if !strings.Contains(strings.TrimPrefix(o.Name, IndexPrefix), "/") {
			names = append(names, o.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// OpenIndex reads index name and verifies every part's checkpoint.
func OpenIndex(ctx context.Context, store checkpoint.Store, name string) (*Source, error) {
	return openIndex(ctx, store, name, true)
}

// IndexSource reads index name and its parts' manifests without
// verifying the parts beforehand: each read checks what it reads
// (checkpoint.ReadTensor). For a reader told the index by one that
// verified it.
func IndexSource(ctx context.Context, store checkpoint.Store, name string) (*Source, error) {
	return openIndex(ctx, store, name, false)
}

func openIndex(ctx context.Context, store checkpoint.Store, name string, verify bool) (*Source, error) {
	var size int64 = -1
	objs, err := store.List(ctx, name)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if o.Name == name {
			size = o.Size
		}
	}
	if size < 0 || size > maxIndexBytes {
		return nil, fmt.Errorf("pipeline checkpoint %s: missing or %d bytes", name, size)
	}
	b := make([]byte, size)
	if err := store.ReadAt(ctx, name, b, 0); err != nil {
		return nil, err
	}
	x, err := DecodeIndex(name, b)
	if err != nil {
		return nil, err
	}
	src := &Source{Index: x, Kind: "pipeline", ID: name}
	for _, p := range x.Parts {
		ps := checkpoint.Prefixed(store, p.Prefix)
		m, err := checkpoint.ReadManifest(ctx, ps, p.ID)
		if err != nil {
			return nil, err
		}
		if verify {
			if err := checkpoint.Verify(ctx, ps, m); err != nil {
				return nil, err
			}
		}
		src.parts = append(src.parts, partOf{store: ps, m: m})
	}
	if err := src.index(); err != nil {
		return nil, err
	}
	return src, nil
}

// NewestIndex is the newest index of the store whose parts all verify
// and whose state hash is hash ("": any); nil when there is none. Indexes that do
// not verify are skipped (said through skip); one of another state is an
// error: the store is another model's.
func NewestIndex(ctx context.Context, store checkpoint.Store, hash string, skip func(name string, err error)) (*Source, error) {
	names, err := IndexNames(ctx, store)
	if err != nil {
		return nil, err
	}
	for i := len(names) - 1; i >= 0; i-- {
		src, err := OpenIndex(ctx, store, names[i])
		if err == nil && hash != "" && src.Index.StateHash != hash {
			return nil, fmt.Errorf("pipeline checkpoint %s holds another model's state (state %s, this job's %s): give this job another --checkpoint location",
				names[i], src.Index.StateHash, hash)
		}
		if err != nil {
			skip(names[i], err)
			continue
		}
		return src, nil
	}
	return nil, nil
}
