package ps

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/internal/pkitest"
)

// TestTLSPlane: a server with the job's mutual TLS serves a client of the
// job (push and pull), and refuses every other peer the issue names: the
// server logs the peer's address and the reason, and the client's call
// fails naming the server.
func TestTLSPlane(t *testing.T) {
	set := pkitest.New(t, "j")
	good, peer := pkitest.Load(t, set.Good, "j"), pkitest.Load(t, set.Peer, "j")
	spec := sgdTable(1)
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	log, logs := pkitest.Logger()
	srv, err := Listen(ServerConfig{Addr: "127.0.0.1:0", Tables: []TableSpec{spec}, Sync: SyncSpec{Mode: ASP, Workers: 1}, System: sys,
		Logger: log, TLS: good.Server("j"), DialTLS: good.Client("j")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx := testContext(t)
	if err := srv.Host(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := srv.SetRole(ctx, 0, true, nil, 1); err != nil {
		t.Fatal(err)
	}
	client := func(cfg *tls.Config) *Client {
		c, err := NewClient(ClientConfig{Worker: 0, Tables: []TableSpec{spec}, Partition: PartitionRange, Shards: 1,
			Sync: SyncSpec{Mode: ASP, Workers: 1}, Directory: StaticDirectory{srv.Addr()}, TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	w := client(peer.Client("j"))
	if _, err := w.Push(ctx, 1, []uint64{4}, []float32{1}); err != nil {
		t.Fatalf("a client of the job: %v", err)
	}
	out := make([]float32, 1)
	if err := w.Pull(ctx, 1, []uint64{4}, out); err != nil {
		t.Fatal(err)
	}
	if want := initial(spec, 4)[0] - 0.5; !near(out, []float32{want}) {
		t.Fatalf("pulled %v over TLS, want %v", out, want)
	}

	for _, r := range append(set.Refused, pkitest.Refused{Name: "plaintext", Reason: "first record does not look like a TLS handshake"}) {
		t.Run(r.Name, func(t *testing.T) {
			var cfg *tls.Config
			if r.Name != "plaintext" {
				cfg = pkitest.Client(t, r.Files)
			}
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			c := client(cfg)
			if r.Name == "plaintext" {
				// A plaintext client never hears a TLS refusal: the
				// server's closing the connection fails its call.
				_, err = c.Push(cctx, 1, []uint64{4}, []float32{1})
			} else {
				err = c.Pull(cctx, 1, []uint64{4}, out)
			}
			if err == nil || !strings.Contains(err.Error(), srv.Addr()) {
				t.Fatalf("the refused client's call: %v, want an error naming the server %s", err, srv.Addr())
			}
			if testing.Verbose() {
				t.Log(err)
			}
			p := pkitest.Refusal(t, logs, "refused a connection: TLS", r.Reason, 10*time.Second)
			if _, _, err := net.SplitHostPort(p); err != nil || !strings.HasPrefix(p, "127.0.0.1:") {
				t.Fatalf("the refusal names the peer %q, want its address", p)
			}
		})
	}
}
