package collective

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"
)

func seedFrames() [][]byte {
	job := JobHash("fuzz")
	data := header{kind: kindData, op: opAllReduce, dtype: Float32, src: 1, gen: 1, seq: 1, job: job, count: 2,
		arg: allreduceArg(Sum, AlgoRecursiveDoubling)}
	hb := header{kind: kindHeartbeat, src: 1, gen: 1, job: job}
	abort := header{kind: kindAbort, op: opCode(kindCode(ErrTimeout)), src: 1, index: 0, gen: 1, job: job}
	return [][]byte{
		encoded(data, make([]byte, 8)),
		append(encoded(hb, nil), encoded(data, make([]byte, 8))...),
		encoded(abort, []byte("boom")),
		encoded(header{kind: kindBye, src: 1, gen: 1, job: job}, nil),
		bytes.Repeat([]byte{0}, headerSize),
	}
}

// FuzzDecodeHeader: any bytes decode to an error or to a header that encodes
// back to the same bytes; never a panic.
func FuzzDecodeHeader(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s[:headerSize])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
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
// it must end with a result or an error, never a panic or a hang.
func FuzzReceive(f *testing.F) {
	for _, s := range seedFrames() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
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
		x := []float32{1, 2}
		err := g.AllReduceWith(context.Background(), Float32s(x), Sum, AlgoRecursiveDoubling)
		if err == nil && (x[0] != x[0] || x[1] != x[1]) {
			return // NaN from fuzzed payload bytes is a legitimate sum
		}
	})
}
