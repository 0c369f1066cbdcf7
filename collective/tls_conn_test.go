package collective

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/pki"
)

// recordConn records the writes made to it, and counts the reads.
type recordConn struct {
	net.Conn // nil in batchConn's own test: only Write is called there
	mu       sync.Mutex
	writes   []int // sizes
	data     []byte
	reads    int
}

func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes = append(c.writes, len(p))
	c.data = append(c.data, p...)
	c.mu.Unlock()
	if c.Conn == nil {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *recordConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.Conn.Read(p)
}

func (c *recordConn) counts() (writes []int, reads int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.writes), c.reads
}

// TestBatchConn: while held, writes wait and go to the socket in writes of
// at most tlsBatch bytes, the rest at the release; unheld writes (the
// handshake's, alerts) go at once, after anything queued; a write larger
// than a batch goes alone.
func TestBatchConn(t *testing.T) {
	type step struct {
		op string // "hold", "release" or "write"
		n  int    // bytes written
	}
	h, r := step{"hold", 0}, step{"release", 0}
	w := func(n int) step { return step{"write", n} }
	tests := []struct {
		name  string
		steps []step
		want  []int // the socket's writes
	}{
		{"unheld writes go at once", []step{w(5), w(7)}, []int{5, 7}},
		{"held writes wait for the release", []step{h, w(5), w(7), r}, []int{12}},
		{"a full batch goes when the next write would not fit", []step{h, w(tlsBatch - 10), w(6), w(20), w(3), r}, []int{tlsBatch - 4, 23}},
		{"exactly a batch", []step{h, w(tlsBatch - 10), w(10), w(1), r}, []int{tlsBatch, 1}},
		{"a write larger than a batch goes alone", []step{h, w(3), w(tlsBatch + 1), w(4), r}, []int{3, tlsBatch + 1, 4}},
		{"an unheld write sends the queue first", []step{h, w(3), r, w(4)}, []int{3, 4}},
		{"nothing queued, nothing sent", []step{h, r}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordConn{}
			b := newBatchConn(rec)
			var sent []byte
			for _, s := range tc.steps {
				switch s.op {
				case "hold":
					b.hold()
				case "release":
					if err := b.release(); err != nil {
						t.Fatal(err)
					}
				case "write":
					p := make([]byte, s.n)
					for i := range p {
						p[i] = byte(len(sent) + i)
					}
					sent = append(sent, p...)
					if n, err := b.Write(p); n != s.n || err != nil {
						t.Fatalf("Write of %d bytes: %d, %v", s.n, n, err)
					}
				}
			}
			if writes, _ := rec.counts(); !slices.Equal(writes, tc.want) {
				t.Errorf("the socket's writes: %v bytes, want %v", writes, tc.want)
			}
			if !bytes.Equal(rec.data, sent) {
				t.Error("the socket got other bytes, or in another order, than were written")
			}
		})
	}
}

// TestTLSConnBatches: a 1 MiB Write of a TLS data-plane connection, 64
// records, reaches the socket in writes of whole batches, and the peer
// reads the socket in as few reads (without the batches: a system call
// per record each way), and gets the bytes written.
func TestTLSConnBatches(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dialer := tlsOf(t, issue(t, ca, "a", "j", time.Hour), "j", now)
	acceptor := tlsOf(t, issue(t, ca, "b", "j", time.Hour), "j", now)
	a, b := net.Pipe() // each Read takes from one Write: reads are counted exactly
	ra, rb := &recordConn{Conn: a}, &recordConn{Conn: b}
	ba, bb := newBatchConn(ra), newBatchConn(rb)
	client := &tlsConn{Conn: tls.Client(ba, dialer.Client), raw: ba}
	server := &tlsConn{Conn: tls.Server(bb, acceptor.Server), raw: bb}
	defer client.Close()
	defer server.Close()
	a.SetDeadline(now.Add(time.Minute))
	b.SetDeadline(now.Add(time.Minute))

	// The handshake's writes are unheld: each goes at once, or neither
	// side would finish. The server's session tickets come after the
	// client's handshake ends; the client reads them with its reads.
	hs := make(chan error, 1)
	go func() { hs <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, client)
	if err := testwait.Recv(t, hs, time.Minute, "the server's handshake"); err != nil {
		t.Fatal(err)
	}
	w0, _ := ra.counts()
	_, r0 := rb.counts()

	msg := make([]byte, 1<<20)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		p := make([]byte, len(msg))
		io.ReadFull(server, p)
		got <- p
	}()
	if n, err := client.Write(msg); n != len(msg) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if p := testwait.Recv(t, got, time.Minute, "the server's read"); !bytes.Equal(p, msg) {
		t.Fatal("the server read other bytes than the client wrote")
	}
	w1, _ := ra.counts()
	_, r1 := rb.counts()
	writes := w1[len(w0):]
	const records = 64                  // of 16 KiB
	wire := len(msg) + records*(5+1+16) // each with a header, its type and a tag
	if want := (wire + tlsBatch - 1) / tlsBatch; len(writes) > want+1 || slices.Max(writes) > tlsBatch {
		t.Errorf("%d bytes in %d records went to the socket in writes of %v bytes, want about %d writes of at most %d", wire, records, writes, want, tlsBatch)
	}
	// A read takes what one write of the pipe left, up to what fits
	// in the buffer: at most two per write.
	if reads := r1 - r0; reads > 2*len(writes) {
		t.Errorf("the server read the socket %d times for %d writes, want at most %d", reads, len(writes), 2*len(writes))
	}
}
