package checkpoint

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
)

// FuzzDecodeManifest: whatever the bytes, decoding returns a manifest that
// validates or an error, and never panics; a decoded manifest's every range
// lies inside its state, so reading by it cannot go out of bounds. Each
// input is decoded as it is and sealed with its right checksum, so the
// checks behind the checksum are fuzzed too.
func FuzzDecodeManifest(f *testing.F) {
	ts := modelTensors()
	fill(ts, 3)
	for _, writers := range []int{1, 3} {
		l := newLayout(ts, 4096, writers)
		stream := make([]byte, l.total)
		copyOut(ts, l.offsets, 0, l.total, stream)
		b, err := proto.Marshal(buildManifest(Meta{ID: NewID(3, 1, 1), Step: 3, World: 3}, ts, stream, l)) // sealed below
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := DecodeManifest("", b); err == nil && !bytes.HasSuffix(b[:len(b)-4], digestTag) {
			t.Fatal("a manifest without its checksum field decoded")
		}
		m, err := DecodeManifest("", sealManifest(bytes.Clone(b)))
		if err != nil {
			return
		}
		for _, o := range m.Objects {
			if o.Offset+o.Bytes > m.TotalBytes {
				t.Fatalf("object %q past the end", o.Name)
			}
		}
		for _, tn := range m.Tensors {
			if tn.Offset+tn.Bytes > m.TotalBytes {
				t.Fatalf("tensor %q past the end", tn.Name)
			}
		}
		if len(m.BlockCrc32C) != int((m.TotalBytes+uint64(m.BlockBytes)-1)/uint64(m.BlockBytes)) {
			t.Fatal("block checksums do not match the blocks")
		}
		again, err := EncodeManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeManifest(m.Id, again); err != nil {
			t.Fatalf("a decoded manifest does not decode again: %v", err)
		}
	})
}
