package chaos

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes every connection on loopback until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().String()
}

func startProxy(t *testing.T, backend string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(ln, TCPDialer(backend), 1)
	t.Cleanup(func() { p.Close() })
	return p
}

// connWait bounds every read and write of a test's connection, and each
// wait for a proxy's stats: a read that hangs fails with os.ErrDeadlineExceeded.
const connWait = 30 * time.Second

// dial connects to addr; the connection's reads and writes fail after
// connWait.
func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, connWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(connWait)); err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

// waitStats waits up to connWait for p's stats to satisfy cond, failing
// the test, naming what it waited for and the stats, if they do not.
func waitStats(t *testing.T, p *Proxy, what string, cond func(ProxyStats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connWait)
	defer cancel()
	if err := p.Wait(ctx, cond); err != nil {
		t.Fatalf("waited for %s: stats %+v: %v", what, p.Stats(), err)
	}
}

// TestProxyDeliversIntact: whatever the delay, rate cap and loss, every
// byte comes back through an echo server intact and in order, and the
// half-close is passed on.
func TestProxyDeliversIntact(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    ProxyFaults
	}{
		{"clean", ProxyFaults{}},
		{"delay", ProxyFaults{Delay: 20 * time.Millisecond}},
		{"rate", ProxyFaults{Rate: 4 << 20}},
		{"loss", ProxyFaults{Loss: 1, LossDelay: 5 * time.Millisecond}},
		{"all", ProxyFaults{Delay: 5 * time.Millisecond, Rate: 8 << 20, Loss: 0.5, LossDelay: 5 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, echoServer(t))
			p.Set(tc.f)
			c := dial(t, p.Addr())
			want := make([]byte, 256<<10)
			rng := rand.New(rand.NewPCG(3, 4))
			for i := range want {
				want[i] = byte(rng.Uint32())
			}
			errc := make(chan error, 1)
			go func() {
				_, err := c.Write(want)
				c.CloseWrite()
				errc <- err
			}()
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("reading the echo through the proxy (%d of %d bytes back): %v", len(got), len(want), err)
			}
			select {
			case err := <-errc:
				if err != nil {
					t.Fatalf("writing through the proxy: %v", err)
				}
			case <-time.After(connWait):
				t.Fatalf("waited %v for the write through the proxy to return", connWait)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("echoed %d bytes through the proxy, got %d back, not the same", len(want), len(got))
			}
			waitStats(t, p, "every byte counted forwarded", func(s ProxyStats) bool { return s.Forwarded == 2*int64(len(want)) })
			s := p.Stats()
			if s.Forwarded != 2*int64(len(want)) || s.Conns != 1 {
				t.Errorf("stats %+v: want %d bytes forwarded over 1 connection", s, 2*len(want))
			}
			if tc.f.Loss == 1 && s.Lost == 0 {
				t.Errorf("stats %+v: loss 1 held no chunk", s)
			}
		})
	}
}

// TestProxyStall: nothing goes through a stalled proxy, and everything
// does, intact, once the stall is cleared; faults set for another client
// address do not touch the connection.
func TestProxyStall(t *testing.T) {
	self := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		name         string
		stall, clear func(*Proxy)
	}{
		{"all", func(p *Proxy) { p.Set(ProxyFaults{Stall: true}) }, func(p *Proxy) { p.Set(ProxyFaults{}) }},
		{"from", func(p *Proxy) {
			p.Set(ProxyFaults{Drop: true}) // for others: this client's own faults win
			p.SetFrom(netip.MustParseAddr("127.0.0.2"), ProxyFaults{Drop: true})
			p.SetFrom(self, ProxyFaults{Stall: true})
		}, func(p *Proxy) { p.SetFrom(self, ProxyFaults{Delay: time.Millisecond}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, echoServer(t))
			tc.stall(p)
			c := dial(t, p.Addr())
			if _, err := c.Write([]byte("held back")); err != nil {
				t.Fatal(err)
			}
			if s := p.Stats(); s.Forwarded != 0 {
				t.Fatalf("a stalled proxy forwarded %d bytes", s.Forwarded)
			}
			tc.clear(p)
			got := make([]byte, len("held back"))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "held back" {
				t.Fatalf("after the stall: %q, %v", got, err)
			}
		})
	}
}

// TestProxyDrop: bytes read while Drop is set never arrive; those after it
// is cleared do.
func TestProxyDrop(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	waitStats(t, p, "the connection", func(s ProxyStats) bool { return s.Conns == 1 })
	p.Set(ProxyFaults{Drop: true})
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	waitStats(t, p, "4 bytes dropped", func(s ProxyStats) bool { return s.Dropped == 4 })
	p.Set(ProxyFaults{})
	if _, err := c.Write([]byte("kept")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "kept" {
		t.Fatalf("after the drop: %q, %v; want only the bytes sent after it", got, err)
	}
}

// TestProxyReset: Reset resets open connections; the client sees a reset.
// A backend that cannot be dialed closes the client's connection.
func TestProxyReset(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	waitStats(t, p, "the connection", func(s ProxyStats) bool { return s.Conns == 1 })
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset reset %d connections, want 1", n)
	}
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the client read %v after a reset, want ECONNRESET", err)
	}
	// The proxy still serves new connections.
	c2 := dial(t, p.Addr())
	if _, err := c2.Write([]byte("again")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(c2, got); err != nil || string(got) != "again" {
		t.Fatalf("after a reset: %q, %v", got, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	q := startProxy(t, dead)
	c3 := dial(t, q.Addr())
	if _, err := c3.Read(make([]byte, 1)); err == nil {
		t.Fatal("read through a proxy to a closed port succeeded")
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("waited %v for the proxy to a closed port to close the client's connection", connWait)
	}
	// The client may see its end close before the proxy counts the refusal.
	waitStats(t, q, "1 refused", func(s ProxyStats) bool { return s.Refused == 1 })
}
