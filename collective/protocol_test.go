package collective

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// tcpPair returns rank 0 as a real group of generation gen and rank 1 as the
// raw, handshaken connection a fake peer writes to.
func tcpPair(t *testing.T, gen uint64) (*Group, net.Conn) {
	t.Helper()
	t0, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t1, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { t0.Close(); t1.Close() })
	peers := []string{t0.Addr(), t1.Addr()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		conns []net.Conn
		err   error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := t1.Connect(ctx, Membership{Job: "proto", Generation: gen, Rank: 1, Peers: peers})
		ch <- res{c, err}
	}()
	g, err := Join(ctx, t0, Membership{Job: "proto", Generation: gen, Rank: 0, Peers: peers}, Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := testwait.Recv(t, ch, 20*time.Second, "rank 1's Connect")
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { g.Close(); r.conns[0].Close() })
	return g, r.conns[0]
}

func encoded(h header, payload []byte) []byte {
	b := make([]byte, headerSize)
	h.length = uint32(len(payload))
	h.encode(b)
	return append(b, payload...)
}

// TestMalformedFrames: a handshaken peer that then speaks garbage makes the
// operation fail with an error naming it, never a hang or a sum.
func TestMalformedFrames(t *testing.T) {
	const gen = 2
	job := JobHash("proto")
	good := header{kind: kindData, op: opAllReduce, dtype: Float32, src: 1, gen: gen, seq: 1, job: job, count: 4,
		arg: allreduceArg(Sum, AlgoRecursiveDoubling)}
	withVersion := func(v byte) []byte {
		b := encoded(good, make([]byte, 16))
		b[4] = v
		return b
	}
	mutate := func(f func(h *header)) []byte {
		h := good
		f(&h)
		return encoded(h, make([]byte, 16))
	}
	cases := []struct {
		name   string
		stream []byte
		close  bool
		kind   error
		detail string
	}{
		{"garbage", bytes.Repeat([]byte{0xab}, 200), false, ErrProtocol, "bad frame magic"},
		{"other-version", withVersion(9), false, ErrProtocol, "protocol version 9"},
		{"corrupt-header", func() []byte { b := encoded(good, make([]byte, 16)); b[20] ^= 1; return b }(), false, ErrProtocol, "checksum"},
		{"older-generation", mutate(func(h *header) { h.gen = gen - 1 }), false, ErrProtocol, "generation 1"},
		{"other-job", mutate(func(h *header) { h.job = JobHash("intruder") }), false, ErrProtocol, "another job"},
		{"wrong-sender", mutate(func(h *header) { h.src = 5 }), false, ErrProtocol, "from rank 5"},
		{"unknown-kind", mutate(func(h *header) { h.kind = 77 }), false, ErrProtocol, "unknown frame kind"},
		{"wrong-count", mutate(func(h *header) { h.count = 5 }), false, ErrMismatch, "5 elements"},
		{"other-algorithm", mutate(func(h *header) { h.arg = allreduceArg(Sum, AlgoHierarchical) }), false, ErrMismatch,
			"rank 1 called with sum via hierarchical, this rank with sum via rd"},
		{"single-copy-on-links", mutate(func(h *header) { h.arg = allreduceArg(Sum, AlgoSingleCopy) }), false, ErrMismatch, "via single-copy"},
		{"unknown-algorithm", mutate(func(h *header) { h.arg = allreduceArg(Sum, lastAlgorithm+1) }), false, ErrProtocol,
			"allreduce frame: unknown allreduce algorithm id 5 (this rank knows 1 ring, 2 rd, 3 single-copy, 4 hierarchical)"},
		{"no-algorithm", mutate(func(h *header) { h.arg = allreduceArg(Sum, AlgoAuto) }), false, ErrProtocol, "unknown allreduce algorithm id 0"},
		{"wrong-length", encoded(good, make([]byte, 12)), false, ErrProtocol, "12 bytes"},
		{"truncated", encoded(good, make([]byte, 16))[:headerSize+7], true, ErrPeerLost, "mid-frame"},
		{"hang-up", nil, true, ErrPeerLost, "lost"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, fake := tcpPair(t, gen)
			done := make(chan error, 1)
			go func() {
				done <- g.AllReduceWith(testContext(t), Float32s(make([]float32, 4)), Sum, AlgoRecursiveDoubling)
			}()
			fake.Write(tc.stream)
			if tc.close {
				// A half-close sends FIN: a full close with our frame unread
				// in its buffer would send RST, which may overtake the
				// partial frame.
				if cw, ok := fake.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				} else {
					fake.Close()
				}
			}
			err := testwait.Recv(t, done, 30*time.Second, "the allreduce to fail on the bad stream")
			var oe *OpError
			if !errors.Is(err, tc.kind) || !errors.As(err, &oe) || oe.Rank != 1 || !strings.Contains(err.Error(), tc.detail) {
				t.Fatalf("got %v, want %v naming rank 1 and mentioning %q", err, tc.kind, tc.detail)
			}
			if err2 := g.Barrier(testContext(t)); !errors.Is(err2, tc.kind) {
				t.Errorf("the failed group accepted another operation: %v", err2)
			}
		})
	}
}

// TestAbortFrameRelaysCause: a peer's abort frame fails this rank's operation
// with the peer's failure kind and blamed rank.
func TestAbortFrameRelaysCause(t *testing.T) {
	g, fake := tcpPair(t, 1)
	reason := []byte("rank 3 went silent")
	h := header{kind: kindAbort, op: opCode(kindCode(ErrTimeout)), src: 1, index: 3, gen: 1, job: JobHash("proto")}
	done := make(chan error, 1)
	go func() { done <- g.Barrier(testContext(t)) }()
	fake.Write(encoded(h, reason))
	err := testwait.Recv(t, done, 30*time.Second, "the barrier to fail on the abort frame")
	var oe *OpError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &oe) || oe.Rank != 3 || oe.ReportedBy != 1 {
		t.Fatalf("got %v, want ErrTimeout about rank 3 reported by rank 1", err)
	}
}

func rawHello(t *testing.T, addr string, version uint16, hello *phalanxpb.Hello) (*phalanxpb.HelloReply, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body, _ := proto.Marshal(hello)
	pre := []byte{0x50, 0x48, 0x48, 0x53, byte(version), byte(version >> 8), byte(len(body)), byte(len(body) >> 8)}
	c.Write(append(pre, body...))
	reply := &phalanxpb.HelloReply{}
	_, err = readHandshake(c, reply)
	return reply, err
}

// TestHandshakeRefusals: garbage, another protocol version, a dead generation
// and a different world size are refused with errors that say so, on both
// sides where both are ours.
func TestHandshakeRefusals(t *testing.T) {
	newT := func() *TCPTransport {
		tr, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0", HandshakeTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		t.Cleanup(cancel)
		return ctx
	}

	t.Run("garbage", func(t *testing.T) {
		tr := newT()
		c, _ := net.Dial("tcp", tr.Addr())
		c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		c.Close()
		_, err := tr.Connect(short(), Membership{Job: "j", Generation: 1, Rank: 0, Peers: []string{tr.Addr(), "127.0.0.1:1"}})
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "bad handshake magic") {
			t.Fatalf("got %v, want a timeout that mentions the refused garbage", err)
		}
	})

	t.Run("other-version", func(t *testing.T) {
		tr := newT()
		hello := &phalanxpb.Hello{ProtocolVersion: 2, Job: "j", Generation: 1, FromRank: 1, ToRank: 0, World: 2}
		reply, err := rawHello(t, tr.Addr(), 2, hello)
		if err != nil || reply.GetOk() || !strings.Contains(reply.GetError(), "version 2") {
			t.Fatalf("peer of version 2 got reply %v, %v", reply, err)
		}
		_, err = tr.Connect(short(), Membership{Job: "j", Generation: 1, Rank: 0, Peers: []string{tr.Addr(), "x"}})
		if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "version 2") {
			t.Fatalf("acceptor got %v, want ErrProtocol about version 2", err)
		}
	})

	t.Run("dialer-sees-other-version", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			readHandshake(c, &phalanxpb.Hello{})
			body, _ := proto.Marshal(&phalanxpb.HelloReply{ProtocolVersion: 3, Ok: true})
			c.Write(append([]byte{0x50, 0x48, 0x48, 0x53, 3, 0, byte(len(body)), 0}, body...))
		}()
		tr := newT()
		_, err := tr.Connect(short(), Membership{Job: "j", Generation: 1, Rank: 1, Peers: []string{ln.Addr().String(), tr.Addr()}})
		if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "version 3") {
			t.Fatalf("got %v, want ErrProtocol about version 3", err)
		}
	})

	t.Run("dead-generation", func(t *testing.T) {
		tr := newT()
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // only registers generation 5 as current
		tr.Connect(ctx, Membership{Job: "j", Generation: 5, Rank: 0, Peers: []string{tr.Addr(), "x"}})
		hello := &phalanxpb.Hello{ProtocolVersion: ProtocolVersion, Job: "j", Generation: 4, FromRank: 1, ToRank: 0, World: 2}
		reply, err := rawHello(t, tr.Addr(), ProtocolVersion, hello)
		if err != nil || reply.GetOk() || !strings.Contains(reply.GetError(), "older than the current generation 5") {
			t.Fatalf("stale generation got reply %v, %v", reply, err)
		}
	})

	t.Run("foreign-job", func(t *testing.T) {
		tr, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0", Job: "j"})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		hello := &phalanxpb.Hello{ProtocolVersion: ProtocolVersion, Job: "other", Generation: 1, FromRank: 1, ToRank: 0, World: 2}
		reply, err := rawHello(t, tr.Addr(), ProtocolVersion, hello)
		if err != nil || reply.GetOk() || !strings.Contains(reply.GetError(), `job "other" is not this rank's job "j"`) {
			t.Fatalf("another job's hello got reply %v, %v", reply, err)
		}
		hello.Job = "jj" // a prefix of the name is not the job
		if reply, err := rawHello(t, tr.Addr(), ProtocolVersion, hello); err != nil || reply.GetOk() || !strings.Contains(reply.GetError(), `job "jj" is not`) {
			t.Fatalf("job jj's hello got reply %v, %v", reply, err)
		}
		tr.mu.Lock()
		parked := len(tr.arrivals)
		tr.mu.Unlock()
		if parked != 0 {
			t.Fatalf("%d connections parked after the refusal", parked)
		}
		// A sub-group of the job (a straggler's feed, "j/feed/<id>") is the job's.
		feed := &phalanxpb.Hello{ProtocolVersion: ProtocolVersion, Job: "j/feed/w3", Generation: 1, FromRank: 1, ToRank: 0, World: 2}
		c, err := net.Dial("tcp", tr.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		body, _ := proto.Marshal(feed)
		c.Write(append([]byte{0x50, 0x48, 0x48, 0x53, byte(ProtocolVersion), byte(ProtocolVersion >> 8), byte(len(body)), byte(len(body) >> 8)}, body...))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			tr.mu.Lock()
			_, ok := tr.arrivals[connKey{"j/feed/w3", 1, 1, 0}]
			changed, last := tr.changed, tr.lastReject
			tr.mu.Unlock()
			if ok {
				break
			}
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("the feed's hello was not parked for its Connect (last refusal: %s)", last)
			}
		}
	})

	t.Run("parked-bound", func(t *testing.T) {
		tr := newT()
		// Hellos of ever newer generations, no Connect to claim them: the
		// first maxParked wait, the next is refused.
		for g := range maxParked {
			c, err := net.Dial("tcp", tr.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			body, _ := proto.Marshal(&phalanxpb.Hello{ProtocolVersion: ProtocolVersion, Job: "j", Generation: uint64(g + 1), FromRank: 1, ToRank: 0, World: 2})
			c.Write(append([]byte{0x50, 0x48, 0x48, 0x53, byte(ProtocolVersion), byte(ProtocolVersion >> 8), byte(len(body)), byte(len(body) >> 8)}, body...))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			tr.mu.Lock()
			n, changed := len(tr.arrivals), tr.changed
			tr.mu.Unlock()
			if n == maxParked {
				break
			}
			select {
			case <-changed:
			case <-ctx.Done():
				t.Fatalf("%d of %d hellos parked: %v", n, maxParked, ctx.Err())
			}
		}
		hello := &phalanxpb.Hello{ProtocolVersion: ProtocolVersion, Job: "j", Generation: maxParked + 1, FromRank: 1, ToRank: 0, World: 2}
		reply, err := rawHello(t, tr.Addr(), ProtocolVersion, hello)
		if err != nil || reply.GetOk() || !strings.Contains(reply.GetError(), "1024 connections already wait for their generation") {
			t.Fatalf("hello beyond the bound got reply %v, %v", reply, err)
		}
	})

	t.Run("world-mismatch", func(t *testing.T) {
		t0, t1 := newT(), newT()
		errs := make(chan error, 2)
		go func() {
			_, err := t0.Connect(short(), Membership{Job: "j", Generation: 1, Rank: 0, Peers: []string{t0.Addr(), t1.Addr()}})
			errs <- err
		}()
		go func() {
			_, err := t1.Connect(short(), Membership{Job: "j", Generation: 1, Rank: 1, Peers: []string{t0.Addr(), t1.Addr(), "x"}})
			errs <- err
		}()
		for range 2 {
			if err := testwait.Recv(t, errs, 30*time.Second, "a Connect of mismatched worlds to fail"); !errors.Is(err, ErrMismatch) {
				t.Errorf("got %v, want ErrMismatch", err)
			}
		}
	})
}

// TestProbe: a liveness probe is answered by an open transport's own code,
// without parking a connection or counting as a refusal; a listener whose
// process never answers (the kernel alone completes a TCP handshake, as it
// does for a process being killed), one that hangs up, one that answers
// garbage, a closed transport and a closed port are each not alive.
func TestProbe(t *testing.T) {
	listen := func(t *testing.T, serve func(net.Conn)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		if serve != nil {
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					serve(c)
				}
			}()
		}
		return ln.Addr().String()
	}
	transport := func(t *testing.T, closed bool) string {
		tr, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0", Job: "j"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			tr.mu.Lock()
			parked, reject := len(tr.arrivals), tr.lastReject
			tr.mu.Unlock()
			if parked != 0 || reject != "" {
				t.Errorf("after the probe: %d connections parked, last refusal %q; want none", parked, reject)
			}
			tr.Close()
		})
		if closed { // closing, its listener not yet: it answers that it is closed
			tr.mu.Lock()
			tr.closed = true
			tr.mu.Unlock()
		}
		return tr.Addr()
	}
	closedPort := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	}
	tests := []struct {
		name  string
		addr  func(t *testing.T) string
		alive bool
		want  string // in the error
	}{
		{"an open transport", func(t *testing.T) string { return transport(t, false) }, true, ""},
		{"a closing transport", func(t *testing.T) string { return transport(t, true) }, false, `answered "transport closed"`},
		{"a listener nobody answers", func(t *testing.T) string { return listen(t, nil) }, false, "no answer"},
		{"a process that hangs up", func(t *testing.T) string { return listen(t, func(c net.Conn) { c.Close() }) }, false, "no answer"},
		{"garbage", func(t *testing.T) string {
			return listen(t, func(c net.Conn) { c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")); c.Close() })
		}, false, "bad handshake magic"},
		{"a closed port", closedPort, false, "connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.addr(t)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := Probe(ctx, addr, nil)
			switch {
			case tc.alive && err != nil:
				t.Fatalf("Probe(%s): %v, want it alive", addr, err)
			case !tc.alive && err == nil:
				t.Fatalf("Probe(%s) found it alive", addr)
			case !tc.alive && (!strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), addr)):
				t.Fatalf("Probe(%s): %v, want an error naming the address and %q", addr, err, tc.want)
			}
		})
	}
}

// TestAdvertise: a transport bound to every interface, IPv4 or IPv6,
// needs an address to advertise and says which flag gives it; a host
// alone takes the bound port, a host:port (a proxy's) is kept; peers
// dial the advertised address.
func TestAdvertise(t *testing.T) {
	tests := []struct {
		name, bind, advertise string
		want                  string // the advertised host ("" : refused)
		err                   string
	}{
		{"loopback", "127.0.0.1:0", "", "127.0.0.1", ""},
		{"every IPv4 interface", "0.0.0.0:0", "", "", "pass --advertise HOST"},
		{"every IPv6 interface", "[::]:0", "", "", "pass --advertise HOST"},
		{"no host", ":0", "", "", "pass --advertise HOST"},
		{"every IPv4 interface, advertised", "0.0.0.0:0", "127.0.0.1", "127.0.0.1", ""},
		{"every IPv6 interface, advertised", "[::]:0", "::1", "::1", ""},
		{"IPv6 loopback", "[::1]:0", "", "::1", ""},
		{"advertising every interface", "0.0.0.0:0", "0.0.0.0", "", "names no host peers can dial"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := ListenTCP(TCPOptions{Bind: tc.bind, Advertise: tc.advertise})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ListenTCP(%s, advertise %q): %v, want an error saying %q", tc.bind, tc.advertise, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			host, port, err := net.SplitHostPort(tr.Addr())
			if err != nil || host != tc.want || port == "0" {
				t.Fatalf("advertised %q, want host %s and the bound port", tr.Addr(), tc.want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := Probe(ctx, tr.Addr(), nil); err != nil {
				t.Fatalf("dialing the advertised address: %v", err)
			}
		})
	}
	// A proxy's address is advertised as it is.
	tr, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0", Advertise: "10.1.2.3:7071"})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.Addr() != "10.1.2.3:7071" {
		t.Errorf("advertised %s, want the proxy's 10.1.2.3:7071", tr.Addr())
	}
}
