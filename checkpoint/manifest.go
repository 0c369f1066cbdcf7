package checkpoint

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Format is the manifest format this package writes and reads.
const Format = 1

// ManifestName is the name of a checkpoint's manifest inside its directory.
const ManifestName = "MANIFEST"

// maxManifestBytes bounds a manifest a reader accepts.
const maxManifestBytes = 64 << 20

// DefaultBlockBytes is the checksum block size.
const DefaultBlockBytes = 1 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Tensor is one float32 tensor of the state saved or restored.
type Tensor struct {
	Name  string
	Shape []int64
	Role  string // "parameter" or "optimizer"
	Data  []float32
}

func (t Tensor) bytes() []byte { return collective.Float32s(t.Data).Raw() }

// layout is how the state's byte stream is cut: tensors in order, blocks
// for checksums, and one block-aligned object per writer.
type layout struct {
	total   int64
	block   int64
	offsets []int64 // of each tensor, and total at the end
	writers int
}

func newLayout(tensors []Tensor, block int64, writers int) layout {
	l := layout{block: block, writers: writers, offsets: make([]int64, len(tensors)+1)}
	for i, t := range tensors {
		l.offsets[i+1] = l.offsets[i] + int64(len(t.Data))*4
	}
	l.total = l.offsets[len(tensors)]
	return l
}

func (l layout) blocks() int64 { return (l.total + l.block - 1) / l.block }

// objectRange is the stream range writer r stores: whole blocks, the last
// one possibly short.
func (l layout) objectRange(r int) (lo, hi int64) {
	b0, b1 := collective.ShardRange(int(l.blocks()), l.writers, r)
	return min(int64(b0)*l.block, l.total), min(int64(b1)*l.block, l.total)
}

func objectName(r, writers int) string { return fmt.Sprintf("shard-%05d-of-%05d", r, writers) }

// copyOut copies stream bytes [lo, hi) from the tensors into dst.
func copyOut(tensors []Tensor, offsets []int64, lo, hi int64, dst []byte) {
	walk(tensors, offsets, lo, hi, func(tb []byte, s int64) { copy(dst[s-lo:], tb) })
}

// copyIn copies stream bytes [lo, lo+len(src)) from src into the tensors.
func copyIn(tensors []Tensor, offsets []int64, lo int64, src []byte) {
	walk(tensors, offsets, lo, lo+int64(len(src)), func(tb []byte, s int64) { copy(tb, src[s-lo:]) })
}

// walk calls f with each tensor's part of stream range [lo, hi) and that
// part's stream offset.
func walk(tensors []Tensor, offsets []int64, lo, hi int64, f func(part []byte, at int64)) {
	for i, t := range tensors {
		a, b := max(lo, offsets[i]), min(hi, offsets[i+1])
		if a >= b {
			continue
		}
		f(t.bytes()[a-offsets[i]:b-offsets[i]], a)
	}
}

// Meta is what a manifest says about the checkpoint besides its tensors.
type Meta struct {
	ID         string
	Job        string
	Step       int64
	Epoch      int64
	Offset     int64
	Seed       uint64
	World      int
	Generation uint64
	ConfigHash string
	StateHash  string
	Created    int64 // unix nanoseconds
	Sequence   uint64
	Loss       float64
	Accuracy   float64
	Samples    int64
	// Model and ModelOptions: the registered model and its options.
	Model        string
	ModelOptions map[string]string
}

// skeleton is the manifest of a checkpoint laid out by l, without the
// checksums: each writer's shard index brings those of its part.
func skeleton(meta Meta, tensors []Tensor, l layout) *phalanxpb.Manifest {
	m := &phalanxpb.Manifest{
		Format: Format, Id: meta.ID, Job: meta.Job, Step: meta.Step, Epoch: meta.Epoch, Offset: meta.Offset,
		Seed: meta.Seed, World: uint32(meta.World), Generation: meta.Generation, ConfigHash: meta.ConfigHash,
		StateHash: meta.StateHash, CreatedUnixNano: meta.Created, TotalBytes: uint64(l.total), BlockBytes: uint32(l.block),
		Sequence: meta.Sequence, Model: meta.Model, ModelOptions: meta.ModelOptions,
		BlockCrc32C: make([]uint32, l.blocks()),
		Stats:       &phalanxpb.CheckpointStats{Loss: meta.Loss, Accuracy: meta.Accuracy, Samples: meta.Samples},
	}
	for r := range l.writers {
		if lo, hi := l.objectRange(r); lo < hi {
			m.Objects = append(m.Objects, &phalanxpb.Object{Name: objectName(r, l.writers), Offset: uint64(lo), Bytes: uint64(hi - lo), Rank: uint32(r)})
		}
	}
	for i, t := range tensors {
		lo, hi := l.offsets[i], l.offsets[i+1]
		pt := &phalanxpb.Tensor{Name: t.Name, Dtype: "float32", Shape: t.Shape, Role: t.Role, Offset: uint64(lo), Bytes: uint64(hi - lo)}
		for k, o := range m.Objects {
			a, b := max(lo, int64(o.Offset)), min(hi, int64(o.Offset+o.Bytes))
			if a < b {
				pt.Segments = append(pt.Segments, &phalanxpb.Segment{Object: uint32(k), Offset: uint64(a) - o.Offset, Bytes: uint64(b - a)})
			}
		}
		m.Tensors = append(m.Tensors, pt)
	}
	return m
}

// objectSegments are the segments stored in object k, in stream order.
func objectSegments(m *phalanxpb.Manifest, k int) []*phalanxpb.Segment {
	var out []*phalanxpb.Segment
	for _, t := range m.Tensors {
		for _, s := range t.Segments {
			if int(s.Object) == k {
				out = append(out, s)
			}
		}
	}
	return out
}

// objectFor returns the index of the object writer rank stores, or -1.
func objectFor(m *phalanxpb.Manifest, rank int) int {
	for k, o := range m.Objects {
		if int(o.Rank) == rank {
			return k
		}
	}
	return -1
}

// indexShard computes the checksums of object k of m, whose bytes are data.
func indexShard(m *phalanxpb.Manifest, k int, data []byte) *phalanxpb.ShardIndex {
	o := m.Objects[k]
	x := &phalanxpb.ShardIndex{Format: Format, Checkpoint: m.Id, Rank: o.Rank, Offset: o.Offset, Bytes: o.Bytes, Crc32C: crc(data)}
	bs := uint64(m.BlockBytes)
	for a := uint64(0); a < o.Bytes; a += bs {
		x.BlockCrc32C = append(x.BlockCrc32C, crc(data[a:min(a+bs, o.Bytes)]))
	}
	for _, s := range objectSegments(m, k) {
		x.SegmentCrc32C = append(x.SegmentCrc32C, crc(data[s.Offset:s.Offset+s.Bytes]))
	}
	return x
}

// fillShard puts the checksums of a shard index into the manifest.
func fillShard(m *phalanxpb.Manifest, k int, x *phalanxpb.ShardIndex) error {
	o := m.Objects[k]
	segs := objectSegments(m, k)
	bs := uint64(m.BlockBytes)
	first := o.Offset / bs
	switch {
	case x.Format != Format || x.Checkpoint != m.Id || x.Rank != o.Rank || x.Offset != o.Offset || x.Bytes != o.Bytes:
		return fmt.Errorf("the index of %s describes %s rank %d bytes [%d,+%d), want rank %d [%d,+%d)",
			o.Name, x.Checkpoint, x.Rank, x.Offset, x.Bytes, o.Rank, o.Offset, o.Bytes)
	case uint64(len(x.BlockCrc32C)) != (o.Bytes+bs-1)/bs || len(x.SegmentCrc32C) != len(segs):
		return fmt.Errorf("the index of %s has %d block and %d segment checksums, want %d and %d",
			o.Name, len(x.BlockCrc32C), len(x.SegmentCrc32C), (o.Bytes+bs-1)/bs, len(segs))
	}
	o.Crc32C = x.Crc32C
	copy(m.BlockCrc32C[first:], x.BlockCrc32C)
	for i, s := range segs {
		s.Crc32C = x.SegmentCrc32C[i]
	}
	return nil
}

func indexName(object string) string { return object + ".idx" }

// idPattern is a checkpoint's name: its step, zero-padded so names sort by
// step, and a suffix that makes it unique.
var idPattern = regexp.MustCompile(`^step-([0-9]{12})-([a-z0-9]+(?:-[a-z0-9]+)*)$`)

// NewID names the checkpoint of step written in a generation decided at
// decided (unix nanoseconds): unique for the job across restarts.
func NewID(step int64, generation uint64, decided int64) string {
	return fmt.Sprintf("step-%012d-g%d-%x", step, generation, uint64(decided))
}

// parseID returns the step of a checkpoint name.
func parseID(id string) (int64, bool) {
	m := idPattern.FindStringSubmatch(id)
	if m == nil {
		return 0, false
	}
	step, err := strconv.ParseInt(m[1], 10, 64)
	return step, err == nil
}

// ManifestError is a manifest that cannot be used.
type ManifestError struct {
	ID     string
	Reason string
}

func (e *ManifestError) Error() string {
	return fmt.Sprintf("checkpoint %s: manifest: %s", e.ID, e.Reason)
}

// digestTag is the key of Manifest.manifest_crc32c (field 20, wire type
// fixed32) as a varint: the first bytes of the manifest's last field.
var digestTag = protowire.AppendTag(nil, 20, protowire.Fixed32Type)

// digestLen is the length of that last field: its key and four bytes.
var digestLen = len(digestTag) + 4

// EncodeManifest is m as stored: its fields (deterministically ordered),
// then its own checksum, the CRC32C of every byte before it.
func EncodeManifest(m *phalanxpb.Manifest) ([]byte, error) {
	bare := proto.Clone(m).(*phalanxpb.Manifest)
	bare.ManifestCrc32C = 0 // a proto3 zero is not written
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(bare)
	if err != nil {
		return nil, err
	}
	return sealManifest(b), nil
}

// sealManifest appends the checksum field to a manifest's bytes.
func sealManifest(b []byte) []byte {
	sum := crc(b)
	b = append(b, digestTag...)
	return protowire.AppendFixed32(b, sum)
}

// DecodeManifest parses and checks a manifest: its bytes must match its own
// checksum, and every offset, length and checksum count must be consistent
// before anything is read by it.
func DecodeManifest(id string, b []byte) (*phalanxpb.Manifest, error) {
	if len(b) > maxManifestBytes {
		return nil, &ManifestError{id, fmt.Sprintf("%d bytes, more than the %d allowed", len(b), maxManifestBytes)}
	}
	n := len(b) - digestLen
	if n < 0 || !bytes.Equal(b[n:n+len(digestTag)], digestTag) {
		return nil, &ManifestError{id, "it does not end with its own checksum (truncated, damaged, or written by a Phalanx before manifests carried one)"}
	}
	if want, got := binary.LittleEndian.Uint32(b[n+len(digestTag):]), crc(b[:n]); want != got {
		return nil, &ManifestError{id, fmt.Sprintf("its bytes have CRC32C %08x, and it records %08x: it was changed or damaged after it was written", got, want)}
	}
	m := &phalanxpb.Manifest{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, &ManifestError{id, fmt.Sprintf("not a manifest: %v", err)}
	}
	if err := validate(m); err != nil {
		return nil, &ManifestError{id, err.Error()}
	}
	if id != "" && m.Id != id {
		return nil, &ManifestError{id, fmt.Sprintf("it names checkpoint %q", m.Id)}
	}
	return m, nil
}

// maxStreamBytes bounds the state a manifest may describe (16 TiB).
const maxStreamBytes = 1 << 44

func validate(m *phalanxpb.Manifest) error {
	switch {
	case m.Format != Format:
		return fmt.Errorf("format %d, this version reads format %d", m.Format, Format)
	case !idPattern.MatchString(m.Id):
		return fmt.Errorf("checkpoint name %q is not step-NNNNNNNNNNNN-suffix", m.Id)
	case m.Step < 0 || m.Epoch < 0 || m.Offset < 0:
		return fmt.Errorf("negative step, epoch or offset")
	case m.World < 1 || m.World > 1<<16:
		return fmt.Errorf("world %d: want 1..65536", m.World)
	case m.TotalBytes > maxStreamBytes:
		return fmt.Errorf("%d bytes of state: more than %d", m.TotalBytes, uint64(maxStreamBytes))
	case m.BlockBytes < 4 || m.BlockBytes%4 != 0 || m.BlockBytes > 1<<30:
		return fmt.Errorf("block size %d: want a multiple of 4 up to 1 GiB", m.BlockBytes)
	}
	if step, _ := parseID(m.Id); step != m.Step {
		return fmt.Errorf("name %q says step %d, the manifest step %d", m.Id, step, m.Step)
	}
	blocks := (m.TotalBytes + uint64(m.BlockBytes) - 1) / uint64(m.BlockBytes)
	if uint64(len(m.BlockCrc32C)) != blocks {
		return fmt.Errorf("%d block checksums for %d blocks", len(m.BlockCrc32C), blocks)
	}
	if len(m.Objects) > int(m.World) {
		return fmt.Errorf("%d objects written by a world of %d", len(m.Objects), m.World)
	}
	var at uint64
	names := map[string]bool{}
	for i, o := range m.Objects {
		switch {
		case o.Offset != at:
			return fmt.Errorf("object %d (%q) starts at byte %d, want %d", i, o.Name, o.Offset, at)
		case o.Bytes == 0 || o.Bytes > m.TotalBytes-at:
			return fmt.Errorf("object %d (%q) of %d bytes does not fit the %d-byte state at %d", i, o.Name, o.Bytes, m.TotalBytes, at)
		case o.Offset%uint64(m.BlockBytes) != 0:
			return fmt.Errorf("object %d (%q) does not start on a block boundary", i, o.Name)
		case !validObjectName(o.Name) || names[o.Name]:
			return fmt.Errorf("object %d: name %q is not a plain, unique name", i, o.Name)
		}
		names[o.Name] = true
		at += o.Bytes
	}
	if at != m.TotalBytes {
		return fmt.Errorf("objects hold %d bytes of a %d-byte state", at, m.TotalBytes)
	}
	at = 0
	tnames := map[string]bool{}
	for i, t := range m.Tensors {
		if t.Name == "" || tnames[t.Name] {
			return fmt.Errorf("tensor %d: empty or repeated name %q", i, t.Name)
		}
		tnames[t.Name] = true
		if t.Dtype != "float32" {
			return fmt.Errorf("tensor %s: dtype %q, want float32", t.Name, t.Dtype)
		}
		n := uint64(1)
		for _, d := range t.Shape {
			if d < 0 || d > maxStreamBytes || (d > 0 && n > maxStreamBytes/uint64(d)) {
				return fmt.Errorf("tensor %s: shape %v out of range", t.Name, t.Shape)
			}
			n *= uint64(d)
		}
		switch {
		case n*4 != t.Bytes:
			return fmt.Errorf("tensor %s: shape %v is %d bytes, the manifest says %d", t.Name, t.Shape, n*4, t.Bytes)
		case t.Offset != at:
			return fmt.Errorf("tensor %s starts at byte %d, want %d", t.Name, t.Offset, at)
		case t.Bytes > m.TotalBytes-at:
			return fmt.Errorf("tensor %s runs past the end of the state", t.Name)
		}
		pos := t.Offset
		for _, s := range t.Segments {
			if int(s.Object) >= len(m.Objects) {
				return fmt.Errorf("tensor %s: segment in object %d of %d", t.Name, s.Object, len(m.Objects))
			}
			o := m.Objects[s.Object]
			if s.Bytes == 0 || s.Offset > o.Bytes || s.Bytes > o.Bytes-s.Offset || o.Offset+s.Offset != pos {
				return fmt.Errorf("tensor %s: segment [%d,+%d) of object %q does not hold its bytes at %d", t.Name, s.Offset, s.Bytes, o.Name, pos)
			}
			pos += s.Bytes
		}
		if pos != t.Offset+t.Bytes {
			return fmt.Errorf("tensor %s: segments hold %d of its %d bytes", t.Name, pos-t.Offset, t.Bytes)
		}
		at += t.Bytes
	}
	if at != m.TotalBytes {
		return fmt.Errorf("tensors hold %d bytes of a %d-byte state", at, m.TotalBytes)
	}
	if s := m.Stats; s != nil && (math.IsNaN(s.Loss) || s.Samples < 0) {
		return fmt.Errorf("statistics: loss %v, %d samples", s.Loss, s.Samples)
	}
	return nil
}

func validObjectName(s string) bool {
	return s != "" && s != "." && s != ".." && s != ManifestName && !strings.HasSuffix(s, ".idx") &&
		!strings.ContainsAny(s, "/\\\x00") && !strings.HasPrefix(s, tmpPrefix)
}

// Compatible reports whether m holds a state for tensors: the same names,
// shapes and order.
func Compatible(m *phalanxpb.Manifest, tensors []Tensor) error {
	if len(m.Tensors) != len(tensors) {
		return fmt.Errorf("checkpoint %s holds %d tensors, this model has %d", m.Id, len(m.Tensors), len(tensors))
	}
	for i, t := range tensors {
		mt := m.Tensors[i]
		if mt.Name != t.Name || !equalShape(mt.Shape, t.Shape) || int64(mt.Bytes) != int64(len(t.Data))*4 {
			return fmt.Errorf("checkpoint %s: tensor %d is %s%v, this model's is %s%v", m.Id, i, mt.Name, mt.Shape, t.Name, t.Shape)
		}
	}
	return nil
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
