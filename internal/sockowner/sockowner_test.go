package sockowner

import (
	"net"
	"os"
	"slices"
	"testing"
)

// TestListener: a listener of this process is found as this process's,
// on IPv4 and IPv6 loopback; a closed port has no owner; an address that
// is not one is an error.
func TestListener(t *testing.T) {
	for _, network := range []struct{ net, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		ln, err := net.Listen(network.net, network.addr)
		if err != nil {
			t.Logf("%s: %v (no such loopback here)", network.net, err)
			continue
		}
		addr := ln.Addr().String()
		if pid, err := Listener(addr); err != nil || pid != os.Getpid() {
			t.Errorf("Listener(%s): %d, %v; want this process, %d", addr, pid, err, os.Getpid())
		}
		ln.Close()
		if pid, err := Listener(addr); err != nil || pid != 0 {
			t.Errorf("Listener(%s) once closed: %d, %v; want none", addr, pid, err)
		}
	}
	if _, err := Listener("nowhere"); err == nil {
		t.Error("Listener of no address: no error")
	}
}

// TestListening: this process's listeners are listed, on IPv4 and IPv6
// loopback, and a closed one no longer.
func TestListening(t *testing.T) {
	for _, network := range []struct{ net, addr string }{{"tcp4", "127.0.0.1:0"}, {"tcp6", "[::1]:0"}} {
		ln, err := net.Listen(network.net, network.addr)
		if err != nil {
			t.Logf("%s: %v (no such loopback here)", network.net, err)
			continue
		}
		addr := ln.Addr().String()
		has := func() bool {
			l, err := Listening(os.Getpid())
			if err != nil {
				t.Fatal(err)
			}
			return slices.Contains(l, addr)
		}
		if !has() {
			t.Errorf("Listening: %s not listed", addr)
		}
		ln.Close()
		if has() {
			t.Errorf("Listening: %s listed once closed", addr)
		}
	}
}
