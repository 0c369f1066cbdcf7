package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/ps"
)

// Manifest describes a parameter-server checkpoint: one object of snapshots
// per shard, then this manifest, written last (a checkpoint without it is
// incomplete and ignored).
type Manifest struct {
	Format    int      `json:"format"`
	Step      int64    `json:"step"`
	Clock     int64    `json:"clock"`
	Shards    int      `json:"shards"`
	Partition string   `json:"partition"`
	Objects   []string `json:"objects"`
	// Checksum is the manifest's own: the CRC32C, in hex, of its JSON
	// encoding with Checksum empty (sealManifest). A manifest whose fields
	// do not give it, or without one, is refused: its step and clock are
	// not believed.
	Checksum string `json:"crc32c"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// digest is the checksum of m's fields other than Checksum.
func (m Manifest) digest() (string, error) {
	m.Checksum = ""
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%08x", crc32.Checksum(b, castagnoli)), nil
}

// sealManifest is m as stored: JSON, its own checksum included.
func sealManifest(m *Manifest) ([]byte, error) {
	sum, err := m.digest()
	if err != nil {
		return nil, err
	}
	m.Checksum = sum
	return json.Marshal(m)
}

// decodeManifest parses a stored manifest and checks it against its own
// checksum and its shard count.
func decodeManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("not a manifest: %w", err)
	}
	sum, err := m.digest()
	switch {
	case err != nil:
		return nil, err
	case m.Checksum == "":
		return nil, errors.New("the manifest has no checksum of its own (written by a Phalanx before manifests carried one, or damaged)")
	case m.Checksum != sum:
		return nil, fmt.Errorf("the manifest's fields have CRC32C %s, and it records %s: it was changed or damaged after it was written", sum, m.Checksum)
	case m.Format != 1 || m.Shards < 1 || len(m.Objects) != m.Shards:
		return nil, fmt.Errorf("format %d with %d objects for %d shards: not a format-1 manifest of its shards", m.Format, len(m.Objects), m.Shards)
	}
	return &m, nil
}

const psPrefix = "ps-"

// Prefix is the store prefix of the checkpoint of step.
func Prefix(step int64) string { return fmt.Sprintf("%s%012d/", psPrefix, step) }

// Saver writes a job's checkpoints from one worker.
type Saver struct {
	Store  checkpoint.Store
	Client *ps.Client
	Tables []uint32
	Spec   Spec
}

// Save takes every shard's rows once every clock before clock is applied
// (under bsp: exactly the first step steps) and writes them, then the
// manifest. A checkpoint of step that verifies is kept and its manifest
// returned (a worker resumed from an earlier one reaches step again);
// anything else under Prefix(step) is no checkpoint (Latest skips it) and is
// removed first, since a store need not replace an object.
func (s *Saver) Save(ctx context.Context, step, clock int64) (*Manifest, error) {
	prefix := Prefix(step)
	objs, err := s.Store.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("checkpoint of step %d: %w", step, err)
	}
	size := map[string]int64{}
	for _, o := range objs {
		size[o.Name] = o.Size
	}
	manifest := prefix + "manifest.json"
	if _, ok := size[manifest]; ok {
		m, _, err := load(ctx, s.Store, manifest, size)
		if err == nil {
			return m, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("checkpoint of step %d: verifying the one in %s: %w", step, prefix, err)
		}
		// The manifest goes first: whatever remains is then no checkpoint.
		if err := s.Store.Delete(ctx, manifest); err != nil {
			return nil, fmt.Errorf("checkpoint of step %d: removing %s, which does not verify: %w", step, manifest, err)
		}
	}
	for _, o := range objs {
		if o.Name == manifest {
			continue
		}
		if err := s.Store.Delete(ctx, o.Name); err != nil {
			return nil, fmt.Errorf("checkpoint of step %d: removing %s, left by a save cut short: %w", step, o.Name, err)
		}
	}
	m := &Manifest{Format: 1, Step: step, Clock: clock, Shards: s.Spec.Shards, Partition: s.Spec.Partition.String()}
	for sh := range s.Spec.Shards {
		var snaps []ps.Snapshot
		for _, t := range s.Tables {
			sn, err := s.Client.Snapshot(ctx, t, sh, clock)
			if err != nil {
				return nil, fmt.Errorf("checkpoint of step %d: shard %d: %w", step, sh, err)
			}
			snaps = append(snaps, sn)
		}
		name := fmt.Sprintf("%sshard-%04d.snap", prefix, sh)
		if err := s.Store.Put(ctx, name, ps.EncodeSnapshots(snaps)); err != nil {
			return nil, fmt.Errorf("checkpoint of step %d: %w", step, err)
		}
		m.Objects = append(m.Objects, name)
	}
	val, err := sealManifest(m)
	if err != nil {
		return nil, err
	}
	if err := s.Store.Put(ctx, manifest, val); err != nil {
		return nil, fmt.Errorf("checkpoint of step %d: %w", step, err)
	}
	return m, nil
}

func readAll(ctx context.Context, store checkpoint.Store, name string, size int64) ([]byte, error) {
	if size < 0 || size > 64<<30 {
		return nil, fmt.Errorf("%s: size %d", name, size)
	}
	b := make([]byte, size)
	if err := store.ReadAt(ctx, name, b, 0); err != nil {
		return nil, err
	}
	return b, nil
}

// Latest finds the newest checkpoint whose objects all read and verify,
// and returns it with its snapshots. Checkpoints that do not verify are
// skipped (and named in the error when none does). With none at all, the
// error satisfies errors.Is(err, checkpoint.ErrNoCheckpoint).
func Latest(ctx context.Context, store checkpoint.Store) (*Manifest, []ps.Snapshot, error) {
	objs, err := store.List(ctx, psPrefix)
	if err != nil {
		return nil, nil, err
	}
	size := map[string]int64{}
	var manifests []string
	for _, o := range objs {
		size[o.Name] = o.Size
		if strings.HasSuffix(o.Name, "/manifest.json") {
			manifests = append(manifests, o.Name)
		}
	}
	if len(manifests) == 0 {
		return nil, nil, fmt.Errorf("cluster: no parameter-server checkpoint in %s: %w", store.Location(), checkpoint.ErrNoCheckpoint)
	}
	slices.Sort(manifests)
	var bad []string
	for i := len(manifests) - 1; i >= 0; i-- {
		m, snaps, err := load(ctx, store, manifests[i], size)
		if err == nil {
			return m, snaps, nil
		}
		bad = append(bad, fmt.Sprintf("%s: %v", manifests[i], err))
	}
	return nil, nil, fmt.Errorf("cluster: no parameter-server checkpoint verifies: %s", strings.Join(bad, "; "))
}

func load(ctx context.Context, store checkpoint.Store, name string, size map[string]int64) (*Manifest, []ps.Snapshot, error) {
	b, err := readAll(ctx, store, name, size[name])
	if err != nil {
		return nil, nil, err
	}
	m, err := decodeManifest(b)
	if err != nil {
		return nil, nil, err
	}
	var all []ps.Snapshot
	for _, o := range m.Objects {
		if !strings.HasPrefix(o, strings.TrimSuffix(name, "manifest.json")) {
			return nil, nil, fmt.Errorf("object %s outside the checkpoint", o)
		}
		sz, ok := size[o]
		if !ok {
			return nil, nil, fmt.Errorf("object %s missing", o)
		}
		b, err := readAll(ctx, store, o, sz)
		if err != nil {
			return nil, nil, err
		}
		snaps, err := ps.DecodeSnapshots(b)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", o, err)
		}
		all = append(all, snaps...)
	}
	return m, all, nil
}

// Load reads the checkpoint at prefix (as Prefix gives) and verifies it.
func Load(ctx context.Context, store checkpoint.Store, prefix string) (*Manifest, []ps.Snapshot, error) {
	objs, err := store.List(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	size := map[string]int64{}
	for _, o := range objs {
		size[o.Name] = o.Size
	}
	if _, ok := size[prefix+"manifest.json"]; !ok {
		return nil, nil, fmt.Errorf("cluster: checkpoint %s has no manifest", prefix)
	}
	return load(ctx, store, prefix+"manifest.json", size)
}

// Restore loads a checkpoint's rows into every shard srv hosts, split by
// the job's partition (any number of shards may have written them).
func Restore(ctx context.Context, srv *ps.Server, spec Spec, snaps []ps.Snapshot) error {
	parts := map[uint32]*ps.Partitioner{}
	for i := range spec.Tables {
		p, err := ps.NewPartitioner(spec.Partition, spec.Shards, &spec.Tables[i])
		if err != nil {
			return err
		}
		parts[spec.Tables[i].ID] = p
	}
	for s := range spec.Shards {
		if err := srv.Restore(ctx, uint32(s), snaps, func(t uint32) *ps.Partitioner { return parts[t] }); err != nil {
			return fmt.Errorf("cluster: restoring shard %d: %w", s, err)
		}
	}
	return nil
}
