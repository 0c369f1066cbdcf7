package actors

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/phalanx-rt/phalanx/internal/pkitest"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// TestTLSRemote: a remote with the job's mutual TLS answers a system of
// the job over it, and refuses every other peer the issue names (no
// certificate, another CA, expired, another job, plaintext), logging the
// peer's address and the reason.
func TestTLSRemote(t *testing.T) {
	set := pkitest.New(t, "j")
	good := pkitest.Load(t, set.Good, "j")
	log, logs := pkitest.Logger()
	a, err := NewSystem(Options{Remote: true, Logger: log, ServerTLS: good.Server("j"), ClientTLS: good.Client("j")})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()

	t.Run("a system of the job", func(t *testing.T) {
		if raceEnabled {
			t.Skip("two protoactor remotes in one process race inside protoactor under -race; the full pass runs this")
		}
		peer := pkitest.Load(t, set.Peer, "j")
		b, err := NewSystem(Options{Remote: true, ServerTLS: peer.Server("j"), ClientTLS: peer.Client("j")})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Shutdown()
		if _, err := a.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
			if h, ok := c.Message().(*phalanxpb.Hello); ok {
				c.Respond(&phalanxpb.Hello{Job: h.Job + " back"})
			}
		}), "echo"); err != nil {
			t.Fatal(err)
		}
		got, err := b.Root.RequestFuture(Ref(a.Address(), "echo"), &phalanxpb.Hello{Job: "j"}, 20*time.Second).Result()
		if err != nil {
			t.Fatalf("a request over TLS: %v", err)
		}
		if h, ok := got.(*phalanxpb.Hello); !ok || h.Job != "j back" {
			t.Fatalf("answered %v, want the echo", got)
		}
	})

	for _, r := range append(set.Refused, pkitest.Refused{Name: "plaintext", Reason: "first record does not look like a TLS handshake"}) {
		t.Run(r.Name, func(t *testing.T) {
			c, err := net.DialTimeout("tcp", a.Address(), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if r.Name == "plaintext" {
				c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")) // gRPC's plaintext preface
			} else {
				cfg := pkitest.Client(t, r.Files)
				cfg.NextProtos = []string{"h2"}
				tc := tls.Client(c, cfg)
				if err = tc.Handshake(); err == nil {
					_, err = tc.Read(make([]byte, 1)) // TLS 1.3: the refusal of this client's certificate
				}
				if err == nil || !strings.Contains(err.Error(), "remote error: tls:") {
					t.Fatalf("a peer with %s: %v, want the remote's refusal", r.Name, err)
				}
			}
			p := pkitest.Refusal(t, logs, "refused a connection: TLS", r.Reason, 10*time.Second)
			if p != c.LocalAddr().String() {
				t.Fatalf("the refusal names the peer %q, want %s", p, c.LocalAddr())
			}
		})
	}
}
