package ps

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Snapshot is one shard's rows of one table at a clock: each row's key and
// its Stride floats (Dim values, then the optimizer's state), so that a
// restored row trains on exactly as it would have.
type Snapshot struct {
	Table       uint32
	Dim, Stride int
	Clock       int64
	Keys        []uint64
	Rows        []float32 // len(Keys) × Stride
}

// snapshot copies a table's rows.
func (t *tableState) snapshot(id uint32) Snapshot {
	s := Snapshot{Table: id, Dim: t.rows.Spec().Dim, Stride: t.rows.Stride(), Clock: t.clocks.Clock()}
	s.Keys = make([]uint64, 0, t.rows.Len())
	s.Rows = make([]float32, 0, t.rows.Len()*s.Stride)
	t.rows.Each(func(k uint64, row []float32) {
		s.Keys = append(s.Keys, k)
		s.Rows = append(s.Rows, row...)
	})
	return s
}

const snapshotMagic = 0x4b435350 // "PSCK"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodeSnapshots serialises snapshots, little-endian, with a CRC-32C of
// everything at the end.
func EncodeSnapshots(snaps []Snapshot) []byte {
	n := 12
	for _, s := range snaps {
		n += 32 + 8*len(s.Keys) + 4*len(s.Rows)
	}
	b := make([]byte, 0, n+4)
	le := binary.LittleEndian
	b = le.AppendUint32(b, snapshotMagic)
	b = le.AppendUint32(b, 1)
	b = le.AppendUint32(b, uint32(len(snaps)))
	for _, s := range snaps {
		b = le.AppendUint32(b, s.Table)
		b = le.AppendUint32(b, uint32(s.Dim))
		b = le.AppendUint32(b, uint32(s.Stride))
		b = le.AppendUint32(b, 0)
		b = le.AppendUint64(b, uint64(s.Clock))
		b = le.AppendUint64(b, uint64(len(s.Keys)))
		for _, k := range s.Keys {
			b = le.AppendUint64(b, k)
		}
		for _, v := range s.Rows {
			b = le.AppendUint32(b, math.Float32bits(v))
		}
	}
	return le.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeSnapshots reads what EncodeSnapshots wrote; a corrupt or truncated
// object is an error naming the problem.
func DecodeSnapshots(b []byte) ([]Snapshot, error) {
	le := binary.LittleEndian
	if len(b) < 16 {
		return nil, fmt.Errorf("ps: snapshot of %d bytes: too short", len(b))
	}
	body, sum := b[:len(b)-4], le.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, fmt.Errorf("ps: snapshot checksum %08x, stored %08x: corrupt", got, sum)
	}
	if m := le.Uint32(body); m != snapshotMagic {
		return nil, fmt.Errorf("ps: not a snapshot (magic %08x)", m)
	}
	if v := le.Uint32(body[4:]); v != 1 {
		return nil, fmt.Errorf("ps: snapshot format %d, want 1", v)
	}
	count := int(le.Uint32(body[8:]))
	at := 12
	var out []Snapshot
	for i := range count {
		if len(body)-at < 32 {
			return nil, fmt.Errorf("ps: snapshot table %d: truncated header", i)
		}
		s := Snapshot{Table: le.Uint32(body[at:]), Dim: int(le.Uint32(body[at+4:])), Stride: int(le.Uint32(body[at+8:])),
			Clock: int64(le.Uint64(body[at+16:]))}
		n := le.Uint64(body[at+24:])
		if r := le.Uint32(body[at+12:]); r != 0 {
			// What EncodeSnapshots writes as zero: anything else is not ours.
			return nil, fmt.Errorf("ps: snapshot table %d: reserved field %#x, want 0", s.Table, r)
		}
		at += 32
		if s.Dim < 1 || s.Dim > MaxDim || s.Stride < s.Dim || s.Stride > 3*MaxDim+1 {
			return nil, fmt.Errorf("ps: snapshot table %d: rows of %d values in %d floats", s.Table, s.Dim, s.Stride)
		}
		need := n * (8 + 4*uint64(s.Stride))
		if n > uint64(len(body)) || need > uint64(len(body)-at) {
			return nil, fmt.Errorf("ps: snapshot table %d: %d rows do not fit in the object", s.Table, n)
		}
		s.Keys = make([]uint64, n)
		for j := range s.Keys {
			s.Keys[j] = le.Uint64(body[at:])
			at += 8
		}
		s.Rows = make([]float32, int(n)*s.Stride)
		for j := range s.Rows {
			s.Rows[j] = math.Float32frombits(le.Uint32(body[at:]))
			at += 4
		}
		out = append(out, s)
	}
	if at != len(body) {
		return nil, fmt.Errorf("ps: snapshot has %d bytes after its last table", len(body)-at)
	}
	return out, nil
}

// Snapshot copies every table of shard id (for a checkpoint). Under bsp and
// hybrid the rows hold exactly the clocks before Snapshot.Clock (an open
// clock's pushes are summed apart until it closes).
func (s *Server) Snapshot(ctx context.Context, id uint32) ([]Snapshot, error) {
	v, err := s.inspect(ctx, id, func(sh *shard) any {
		var out []Snapshot
		for tid, t := range sh.tables {
			out = append(out, t.snapshot(tid))
		}
		return out
	})
	if err != nil {
		return nil, err
	}
	return v.([]Snapshot), nil
}

// Restore loads into shard id the rows of snaps (taken from any number of
// shards) that part places on it, and sets its clocks to the snapshots'
// (workers resume at that clock; push ids start again). The shard must hold
// no rows yet.
func (s *Server) Restore(ctx context.Context, id uint32, snaps []Snapshot, part func(table uint32) *Partitioner) error {
	v, err := s.inspect(ctx, id, func(sh *shard) any {
		for _, sn := range snaps {
			t := sh.tables[sn.Table]
			if t == nil {
				return fmt.Errorf("ps: the snapshot has table %d, this job has not", sn.Table)
			}
			if t.rows.Stride() != sn.Stride || t.rows.Spec().Dim != sn.Dim {
				return fmt.Errorf("ps: table %q: the snapshot's rows are %d values in %d floats, this job's %d in %d (another optimizer?)",
					t.rows.Spec().Name, sn.Dim, sn.Stride, t.rows.Spec().Dim, t.rows.Stride())
			}
			p := part(sn.Table)
			for i, k := range sn.Keys {
				if p.Shard(k) != int(id) {
					continue
				}
				if err := t.rows.Load(k, sn.Rows[i*sn.Stride:(i+1)*sn.Stride]); err != nil {
					return err
				}
			}
			t.clocks.restore(sn.Clock)
		}
		return error(nil)
	})
	if err != nil {
		return err
	}
	if e, _ := v.(error); e != nil {
		return e
	}
	return nil
}
