package ps

import (
	"bytes"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

func TestFrameRoundTrip(t *testing.T) {
	cases := []struct {
		name   string
		h      Header
		keys   []uint64
		values []float32
	}{
		{"pull request", Header{Op: OpPull, ID: 7, Shard: 2, Table: 1, Clock: 3, Worker: 1, Dim: 2, Seq: 1 << 60}, []uint64{5, 1 << 40}, nil},
		{"pull answer", Header{Op: OpPull, Flags: FlagResponse, ID: 7, Dim: 2}, []uint64{5, 6}, []float32{1, 2, 3, 4}},
		{"push", Header{Op: OpPush, ID: 9, Dim: 1, Clock: 4}, []uint64{1, 2, 3}, []float32{0.5, -1, 2}},
		{"empty push", Header{Op: OpPush, ID: 10, Dim: 4, Clock: 4}, nil, nil},
		{"push ack", Header{Op: OpPush, Flags: FlagResponse | FlagStale, ID: 9}, nil, nil},
		{"replicated push", Header{Op: OpReplicate, Worker: 2, ID: 5, Clock: 3, Dim: 1}, []uint64{8}, []float32{6}},
		{"clock close", Header{Op: OpReplicate, Flags: FlagClose, Clock: 3}, nil, nil},
		{"info", Header{Op: OpInfo, Flags: FlagResponse, Clock: 12}, []uint64{100, 3, 4}, nil},
	}
	var wire bytes.Buffer
	w := NewWriter(&wire)
	for _, tc := range cases {
		if err := w.Write(tc.h, tc.keys, tc.values); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	if err := w.WriteError(Header{Op: OpPush, ID: 11}, StatusNotPrimary, "shard 2 moved"); err != nil {
		t.Fatal(err)
	}
	var hdr [headerSize]byte
	var buf Buffer
	for _, tc := range cases {
		f, err := ReadFrame(&wire, &hdr, &buf)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := tc.h
		want.Count = uint32(len(tc.keys))
		if f.Header != want || !slices.Equal(f.Keys, tc.keys) || !slices.Equal(f.Values, tc.values) {
			t.Errorf("%s: read %+v %v %v, want %+v %v %v", tc.name, f.Header, f.Keys, f.Values, want, tc.keys, tc.values)
		}
	}
	f, err := ReadFrame(&wire, &hdr, &buf)
	if err != nil || f.Status != StatusNotPrimary || f.Message != "shard 2 moved" || f.ID != 11 || f.Flags&FlagResponse == 0 {
		t.Fatalf("error answer: %+v %v", f, err)
	}
	if _, err := ReadFrame(&wire, &hdr, &buf); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

func TestFrameRejects(t *testing.T) {
	good := func() []byte {
		var b bytes.Buffer
		if err := NewWriter(&b).Write(Header{Op: OpPush, Dim: 2}, []uint64{1}, []float32{1, 2}); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	cases := []struct {
		name   string
		mutate func([]byte) []byte
		want   string
	}{
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, "magic"},
		{"unknown op", func(b []byte) []byte { b[4] = 99; return b }, "unknown op"},
		{"unknown flags", func(b []byte) []byte { b[7] = 0x80; return b }, "unknown flags"},
		{"wide rows", func(b []byte) []byte { b[42] = 0xff; return b }, "row width"},
		{"body length lies", func(b []byte) []byte { b[44]++; return b }, "body of"},
		{"huge body", func(b []byte) []byte { b[47] = 0x7f; return b }, "above"},
		{"close on a push", func(b []byte) []byte { b[6] |= byte(FlagClose); return b }, "clock close"},
		{"truncated", func(b []byte) []byte { return b[:len(b)-3] }, "body bytes"},
		{"short", func(b []byte) []byte { return b[:10] }, "shorter than a header"},
		{"status on a request", func(b []byte) []byte { b[5] = 1; return b }, "status"},
	}
	var buf Buffer
	for _, tc := range cases {
		_, err := DecodeFrame(tc.mutate(good()), &buf)
		var fe *FrameError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a FrameError about %q", tc.name, err, tc.want)
		}
	}
	if err := NewWriter(io.Discard).Write(Header{Op: OpPush, Dim: 2}, []uint64{1}, []float32{1}); err == nil {
		t.Error("a push with too few values was written")
	}
}

// TestReadFrameGrows: a frame larger than frameReadChunk, read in pieces
// (the buffer grows as its body arrives), comes out whole, and so does a
// small one after it in the same buffer; the same frame cut short is an
// unexpected EOF, having reserved no more than about twice what came.
func TestReadFrameGrows(t *testing.T) {
	const keys, dim = 1 << 16, 16 // a body of 4.5 MiB
	h := Header{Op: OpPush, ID: 3, Dim: dim, Clock: 2}
	k, v := make([]uint64, keys), make([]float32, keys*dim)
	for i := range k {
		k[i] = uint64(i) * 7919
	}
	for i := range v {
		v[i] = float32(i) / 3
	}
	var wire bytes.Buffer
	w := NewWriter(&wire)
	if err := w.Write(h, k, v); err != nil {
		t.Fatal(err)
	}
	whole := slices.Clone(wire.Bytes())
	if err := w.Write(Header{Op: OpPull, ID: 4, Dim: 2}, []uint64{1, 2}, nil); err != nil {
		t.Fatal(err)
	}
	var hdr [headerSize]byte
	var buf Buffer
	r := iotest.HalfReader(&wire)
	f, err := ReadFrame(r, &hdr, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if want := h; f.Count != keys || !slices.Equal(f.Keys, k) || !slices.Equal(f.Values, v) || f.ID != want.ID {
		t.Fatalf("read %+v with %d keys and %d values, want the %d keys and %d values written", f.Header, len(f.Keys), len(f.Values), keys, len(v))
	}
	if f, err = ReadFrame(r, &hdr, &buf); err != nil || f.Op != OpPull || !slices.Equal(f.Keys, []uint64{1, 2}) {
		t.Fatalf("the frame after it: %+v, %v", f, err)
	}
	cut := whole[:len(whole)/3]
	var small Buffer
	if _, err := ReadFrame(bytes.NewReader(cut), &hdr, &small); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a frame cut short: %v, want io.ErrUnexpectedEOF", err)
	}
	if got := small.capacity(); got > 3*len(cut) {
		t.Errorf("a frame cut at %d bytes reserved %d", len(cut), got)
	}
}

// FuzzDecodeFrame: any bytes decode to a FrameError or to a frame that
// encodes back to the same bytes, never a panic; ReadFrame reads the same
// frame from a stream, allocating no more than the stream carried.
func FuzzDecodeFrame(f *testing.F) {
	for _, h := range []Header{{Op: OpPull, Dim: 2}, {Op: OpPush, Dim: 1}, {Op: OpPull, Flags: FlagResponse, Dim: 1}} {
		var b bytes.Buffer
		NewWriter(&b).Write(h, []uint64{1, 2}, make([]float32, 2*int(h.Dim))[:map[bool]int{true: 2 * int(h.Dim), false: 0}[h.Op.carriesValues(h.Flags&FlagResponse != 0)]])
		f.Add(b.Bytes())
	}
	var b bytes.Buffer
	NewWriter(&b).WriteError(Header{Op: OpPull}, StatusBadRequest, "no")
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		// ReadFrame, what servers and clients read connections with,
		// allocates in proportion to the bytes that came, not to what a
		// header announced: a peer speaking garbage cannot make it reserve
		// a gigabyte with 56 bytes.
		var rbuf Buffer
		var hdr [headerSize]byte
		rf, rerr := ReadFrame(bytes.NewReader(data), &hdr, &rbuf)
		if got, bound := 8*cap(rbuf.words), 3*len(data)+2*frameReadChunk; got > bound {
			t.Fatalf("ReadFrame of %d bytes (%v) allocated %d bytes, want at most %d", len(data), rerr, got, bound)
		}
		var buf Buffer
		fr, err := DecodeFrame(data, &buf)
		if err != nil {
			return
		}
		bits := func(v []float32) []uint32 { // NaN payloads compare too
			out := make([]uint32, len(v))
			for i, x := range v {
				out[i] = math.Float32bits(x)
			}
			return out
		}
		if rerr != nil || rf.Header != fr.Header || !slices.Equal(rf.Keys, fr.Keys) || !slices.Equal(bits(rf.Values), bits(fr.Values)) || rf.Message != fr.Message {
			t.Fatalf("ReadFrame read %+v, %v; DecodeFrame %+v", rf, rerr, fr)
		}
		// A frame that decodes re-encodes to the same bytes.
		var out bytes.Buffer
		w := NewWriter(&out)
		if fr.bodyLen() < 0 {
			err = w.WriteError(fr.Header, fr.Status, fr.Message)
		} else {
			err = w.Write(fr.Header, fr.Keys, fr.Values)
		}
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", fr.Header, err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("re-encoded %x, read %x", out.Bytes(), data)
		}
	})
}
