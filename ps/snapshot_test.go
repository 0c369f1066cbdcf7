package ps

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"strings"
	"testing"
)

// TestSnapshotReshard: two shards' rows (values and Adam's state) saved and
// restored into three shards: every key lands on its new shard with the
// same row, and trains on identically.
func TestSnapshotReshard(t *testing.T) {
	spec := sgdTable(2)
	spec.Optimizer = Adam
	ctx := testContext(t)
	old := newCluster(t, 2, 2, 0, []TableSpec{spec}, SyncSpec{Mode: ASP, Workers: 1})
	w := old.client(0, PartitionHash)
	keys := []uint64{1, 2, 3, 50, 77, 400, 999}
	grads := make([]float32, 2*len(keys))
	for i := range grads {
		grads[i] = float32(i%5) - 2
	}
	for range 3 {
		if _, err := w.Push(ctx, 1, keys, grads); err != nil {
			t.Fatal(err)
		}
	}
	var blobs [][]byte
	for i, s := range old.servers {
		snaps, err := s.Snapshot(ctx, uint32(i))
		if err != nil {
			t.Fatal(err)
		}
		blobs = append(blobs, EncodeSnapshots(snaps))
	}
	var all []Snapshot
	for _, b := range blobs {
		snaps, err := DecodeSnapshots(b)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, snaps...)
	}
	fresh := newCluster(t, 3, 3, 0, []TableSpec{spec}, SyncSpec{Mode: ASP, Workers: 1})
	p3, _ := NewPartitioner(PartitionHash, 3, &spec)
	for i, s := range fresh.servers {
		if err := s.Restore(ctx, uint32(i), all, func(uint32) *Partitioner { return p3 }); err != nil {
			t.Fatal(err)
		}
	}
	w3 := fresh.client(0, PartitionHash)
	if err := w3.SetClock(1, all[0].Clock); err != nil {
		t.Fatal(err)
	}
	a, b := make([]float32, 2*len(keys)), make([]float32, 2*len(keys))
	for round := range 2 {
		if err := w.Pull(ctx, 1, keys, a); err != nil {
			t.Fatal(err)
		}
		if err := w3.Pull(ctx, 1, keys, b); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Fatalf("round %d: 2 shards hold %v, the 3 restored ones %v", round, a, b)
		}
		w.Push(ctx, 1, keys, grads) // Adam's state carried over: the same step
		if _, err := w3.Push(ctx, 1, keys, grads); err != nil {
			t.Fatal(err)
		}
	}
	rows := 0
	for i := range fresh.servers {
		rows += len(fresh.rows(i, uint32(i), 1))
	}
	if rows != len(keys) {
		t.Fatalf("%d rows over the 3 shards, want %d", rows, len(keys))
	}
	// A corrupt object is refused with a reason.
	bad := slices.Clone(blobs[0])
	bad[20] ^= 1
	if _, err := DecodeSnapshots(bad); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("a flipped bit: %v", err)
	}
}

// FuzzDecodeSnapshots fuzzes the body of a snapshot object and appends its
// CRC-32C (xored with sumXor), so that the decoder behind the checksum is
// reached: arbitrary bytes almost never carry a valid checksum. With a valid
// checksum the object decodes to an error or to snapshots that encode back
// to the same bytes, never a panic or an allocation the object cannot fill;
// with a wrong one it is refused as corrupt.
func FuzzDecodeSnapshots(f *testing.F) {
	body := EncodeSnapshots([]Snapshot{{Table: 1, Dim: 1, Stride: 2, Clock: 3, Keys: []uint64{4}, Rows: []float32{5, 6}}})
	body = body[:len(body)-4]
	f.Add(body, uint32(0))
	f.Add(body, uint32(1))
	f.Fuzz(func(t *testing.T, body []byte, sumXor uint32) {
		b := binary.LittleEndian.AppendUint32(slices.Clip(body), crc32.Checksum(body, castagnoli)^sumXor)
		snaps, err := DecodeSnapshots(b)
		if sumXor != 0 {
			if err == nil || (len(b) >= 16 && !strings.Contains(err.Error(), "corrupt")) {
				t.Fatalf("an object whose checksum is off by %08x: %v, want an error saying corrupt", sumXor, err)
			}
			return
		}
		if err != nil {
			return
		}
		if got := EncodeSnapshots(snaps); !slices.Equal(got, b) {
			t.Fatalf("re-encoded %x, read %x", got, b)
		}
	})
}
