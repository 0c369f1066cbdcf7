package collective

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"math"
	"net"
	"slices"
	"testing"
	"time"
)

func seedFrames() [][]byte {
	job := JobHash("fuzz")
	data := header{kind: kindData, op: opAllReduce, dtype: Float32, src: 1, gen: 1, seq: 1, job: job, count: 2,
		arg: allreduceArg(Sum, AlgoRecursiveDoubling)}
	hb := header{kind: kindHeartbeat, src: 1, gen: 1, job: job}
	abort := header{kind: kindAbort, op: opCode(kindCode(ErrTimeout)), src: 1, index: 0, gen: 1, job: job}
	withAlgo := func(a Algorithm) []byte {
		h := data
		h.arg = allreduceArg(Sum, a)
		return encoded(h, make([]byte, 8))
	}
	return [][]byte{
		encoded(data, make([]byte, 8)),
		withAlgo(AlgoRing),
		withAlgo(AlgoSingleCopy),
		withAlgo(AlgoHierarchical),
		withAlgo(lastAlgorithm + 1), // an id this rank does not know
		append(encoded(hb, nil), encoded(data, make([]byte, 8))...),
		encoded(abort, []byte("boom")),
		encoded(header{kind: kindBye, src: 1, gen: 1, job: job}, nil),
		bytes.Repeat([]byte{0}, headerSize),
	}
}

// sealed is stream with the checksum of each frame header in it set right
// (frames follow one another, each header's length field giving its
// payload's): fuzzed bytes almost never carry a valid CRC-32C, so without
// this the fuzzers would test little but the checksum's refusal.
func sealed(stream []byte) []byte {
	out := slices.Clone(stream)
	for at := 0; len(out)-at >= headerSize; {
		h := out[at : at+headerSize]
		binary.LittleEndian.PutUint32(h[60:], crc32.Checksum(h[:60], castagnoli))
		at += headerSize + int(binary.LittleEndian.Uint32(h[48:]))
	}
	return out
}

// FuzzDecodeHeader: any bytes decode to an error or to a header that encodes
// back to the same bytes; never a panic. With seal, the checksum is made
// right first, so that the checks behind it are reached.
func FuzzDecodeHeader(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s[:headerSize], false)
		f.Add(s[:headerSize], true)
	}
	f.Fuzz(func(t *testing.T, b []byte, seal bool) {
		if seal {
			b = sealed(b)
		}
		h, err := decodeHeader(b)
		if err != nil {
			return
		}
		out := make([]byte, headerSize)
		h.encode(out)
		if !bytes.Equal(out, b[:headerSize]) {
			t.Fatalf("decode/encode round trip changed the header:\n in %x\nout %x", b[:headerSize], out)
		}
	})
}

// FuzzReceive feeds arbitrary bytes to a rank in the middle of an allreduce:
// it must end with a result or an error, never a panic or a hang; and a
// result without an error must be the true sum, bit for bit: its own input
// plus the payload of the first data frame of the stream (heartbeats before
// it skipped), the peer's contribution, added in either order. With seal,
// every frame header's checksum is made right first (sealed).
func FuzzReceive(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s, false)
		f.Add(s, true)
	}
	job := JobHash("fuzz")
	data := header{kind: kindData, op: opAllReduce, dtype: Float32, src: 1, gen: 1, seq: 1, job: job, count: 2,
		arg: allreduceArg(Sum, AlgoRecursiveDoubling)}
	payload := make([]byte, 8)
	binary.LittleEndian.PutUint32(payload[0:], math.Float32bits(0.1))
	binary.LittleEndian.PutUint32(payload[4:], math.Float32bits(-2.5e7))
	f.Add(encoded(data, payload), true)
	f.Fuzz(func(t *testing.T, stream []byte, seal bool) {
		if seal {
			stream = sealed(stream)
		}
		a, b := net.Pipe()
		g := newGroup([]net.Conn{nil, a}, Membership{Job: "fuzz", Generation: 1, Rank: 0, Peers: []string{"0", "1"}},
			Options{Timeout: 5 * time.Second, CloseGrace: time.Millisecond})
		defer g.Close()
		go func() {
			go func() { // the fake peer never reads: drain what rank 0 writes
				buf := make([]byte, 4096)
				for {
					if _, err := b.Read(buf); err != nil {
						return
					}
				}
			}()
			b.Write(stream)
			b.Close()
		}()
		in := []float32{1, 2}
		x := slices.Clone(in)
		err := g.AllReduceWith(context.Background(), Float32s(x), Sum, AlgoRecursiveDoubling)
		if err != nil {
			return
		}
		peer, ok := firstDataPayload(stream)
		if !ok || len(peer) != 4*len(in) {
			t.Fatalf("allreduce returned %v and no error from a stream whose first data frame carries %d bytes (found %v), want 8:\n%x",
				x, len(peer), ok, stream)
		}
		for i := range in {
			want := in[i] + math.Float32frombits(binary.LittleEndian.Uint32(peer[4*i:]))
			if math.Float32bits(x[i]) != math.Float32bits(want) && !(want != want && x[i] != x[i]) {
				t.Fatalf("element %d: allreduce returned %v (%#08x) and no error, the sum is %v (%#08x)",
					i, x[i], math.Float32bits(x[i]), want, math.Float32bits(want))
			}
		}
	})
}

// firstDataPayload is the payload of the first data frame in stream, after
// any heartbeats; ok is false if a frame before it does not decode, is of
// another kind, or the stream ends first.
func firstDataPayload(stream []byte) (payload []byte, ok bool) {
	for len(stream) >= headerSize {
		h, err := decodeHeader(stream)
		if err != nil {
			return nil, false
		}
		stream = stream[headerSize:]
		switch h.kind {
		case kindHeartbeat:
			continue
		case kindData:
			if uint64(h.length) > uint64(len(stream)) {
				return nil, false
			}
			return stream[:h.length], true
		default:
			return nil, false
		}
	}
	return nil, false
}

// FuzzShmControlWords: any bytes in a segment header, hello or slab
// descriptor decode to an error or to a record that encodes back to the same
// bytes, never a panic; and a record of another job, generation or sequence
// is refused. With seal, each record's CRC-32C (bytes 60..63 over 0..59) is
// made right first, so that the checks behind it are reached.
func FuzzShmControlWords(f *testing.F) {
	job := JobHash("fuzz")
	hdr := segHeader{kind: segKindRank, job: job, gen: 3, a: 1, world: 4, pid: 77, ring: 4096, slab: 8192, nonce: 5}
	desc := opDesc{job: job, gen: 3, seq: 9, step: 12, count: 100, offset: 0, dtype: Float32, arg: allreduceArg(Sum, AlgoSingleCopy)}
	var a, b [ctrlSize]byte
	hdr.encode(a[:], segMagic)
	desc.encode(b[:])
	f.Add(a[:], b[:], false)
	for _, algo := range []Algorithm{AlgoRing, lastAlgorithm + 1} { // another algorithm, an unknown one
		other := desc
		other.arg = allreduceArg(Sum, algo)
		var ob [ctrlSize]byte
		other.encode(ob[:])
		f.Add(a[:], ob[:], false)
	}
	f.Add(bytes.Repeat([]byte{0xff}, ctrlSize), make([]byte, ctrlSize), false)
	f.Add(bytes.Repeat([]byte{0xff}, ctrlSize), make([]byte, ctrlSize), true)
	f.Fuzz(func(t *testing.T, hb, db []byte, seal bool) {
		if seal {
			for _, p := range []*[]byte{&hb, &db} {
				if len(*p) >= ctrlSize {
					*p = slices.Clone(*p)
					binary.LittleEndian.PutUint32((*p)[60:], crc32.Checksum((*p)[:60], castagnoli))
				}
			}
		}
		if h, err := decodeSegHeader(hb, segMagic); err == nil {
			out := make([]byte, ctrlSize)
			h.encode(out, segMagic)
			if !bytes.Equal(out, hb[:ctrlSize]) {
				t.Fatalf("segment header round trip changed:\n in %x\nout %x", hb[:ctrlSize], out)
			}
			want := hdr
			want.nonce = 0
			if err := h.expect(want); err == nil && (h.job != job || h.gen != hdr.gen || h.a != hdr.a || h.kind != hdr.kind) {
				t.Fatalf("foreign header %+v accepted", h)
			}
		}
		if d, err := decodeOpDesc(db); err == nil {
			out := make([]byte, ctrlSize)
			d.encode(out)
			if !bytes.Equal(out, db[:ctrlSize]) {
				t.Fatalf("descriptor round trip changed:\n in %x\nout %x", db[:ctrlSize], out)
			}
			if _, kind := d.check(desc); kind == nil && d != desc {
				t.Fatalf("descriptor %+v accepted for %+v", d, desc)
			}
		}
	})
}

// TestShmControlWordsRefused: each foreign field is refused with its kind.
func TestShmControlWordsRefused(t *testing.T) {
	want := opDesc{job: 1, gen: 2, seq: 3, step: 4, count: 5, dtype: Float32, arg: 6}
	for _, tc := range []struct {
		name string
		edit func(*opDesc)
		kind error
	}{
		{"job", func(d *opDesc) { d.job++ }, ErrProtocol},
		{"generation", func(d *opDesc) { d.gen++ }, ErrProtocol},
		{"sequence", func(d *opDesc) { d.seq++ }, ErrMismatch},
		{"count", func(d *opDesc) { d.count++ }, ErrMismatch},
		{"dtype", func(d *opDesc) { d.dtype = Float64 }, ErrMismatch},
		{"step", func(d *opDesc) { d.step++ }, ErrProtocol},
		{"algorithm", func(d *opDesc) { d.arg = allreduceArg(Sum, AlgoRing) }, ErrMismatch},
		{"unknown-algorithm", func(d *opDesc) { d.arg = allreduceArg(Sum, lastAlgorithm+1) }, ErrProtocol},
	} {
		d := want
		tc.edit(&d)
		var b [ctrlSize]byte
		d.encode(b[:])
		got, err := decodeOpDesc(b[:])
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, kind := got.check(want); kind != tc.kind {
			t.Errorf("%s: kind %v, want %v", tc.name, kind, tc.kind)
		}
		b[3] ^= 1
		if _, err := decodeOpDesc(b[:]); err == nil {
			t.Errorf("%s: corrupt descriptor accepted", tc.name)
		}
	}
}
