package coordinator

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/pkitest"
	"github.com/phalanx-rt/phalanx/pki"
)

// TestTLSEtcd: an embedded etcd with the job's mutual TLS serves a client
// of the job over https, and refuses every other client the issue names
// (no certificate, another CA, expired, another job: etcd's own
// client-certificate auth and its allowed common names, pki.JobCN), and a
// plaintext one: the server logs the peer's address and the reason, and
// the client's Dial fails naming the endpoint and what it was told. A
// client of the job refuses a server of another job, and plaintext
// endpoints are refused before any dial.
func TestTLSEtcd(t *testing.T) {
	set := pkitest.New(t, "j")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log, logs := pkitest.Logger()
	e, err := StartEmbedded(ctx, EmbeddedOptions{Dir: t.TempDir(), Logger: log, TLS: set.Good})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ep := e.Endpoints()[0]
	if !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("endpoint %s, want https", ep)
	}
	host := strings.TrimPrefix(ep, "https://")

	peer := pkitest.Load(t, set.Peer, "j")
	cli, err := Dial(ctx, []string{host}, DialOptions{TLS: peer.Client("j"), Wait: 20 * time.Second}) // a bare host:port is https with TLS
	if err != nil {
		t.Fatalf("a client of the job: %v", err)
	}
	if _, err := cli.Put(ctx, "/phalanx/j/x", "1"); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, "/phalanx/j/x")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "1" {
		t.Fatalf("read back %v, %v", r, err)
	}
	cli.Close()

	reasons := map[string]string{ // etcd's own words, from crypto/x509 and its allowed CNs
		"no certificate": "didn't provide a certificate",
		"another CA":     "certificate signed by unknown authority",
		"expired":        "certificate has expired",
		"another job":    "client certificate authentication failed",
	}
	for _, r := range set.Refused {
		t.Run(r.Name, func(t *testing.T) {
			_, err := Dial(ctx, []string{ep}, DialOptions{TLS: pkitest.Client(t, r.Files), Wait: 2 * time.Second, Every: time.Hour})
			if err == nil || !strings.Contains(err.Error(), "TLS with "+host+": remote error: tls:") {
				t.Fatalf("a client with %s: %v, want an error naming %s and its refusal", r.Name, err, host)
			}
			if p := pkitest.Refusal(t, logs, "etcd refused a connection: TLS", reasons[r.Name], 10*time.Second); !strings.HasPrefix(p, "127.0.0.1:") {
				t.Fatalf("the refusal names the peer %q", p)
			}
		})
	}
	t.Run("plaintext", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
		if p := pkitest.Refusal(t, logs, "etcd refused a connection: TLS", "first record does not look like a TLS handshake", 10*time.Second); p != c.LocalAddr().String() {
			t.Fatalf("the refusal names the peer %q, want %s", p, c.LocalAddr())
		}
		if _, err := Connect([]string{"http://" + host}, peer.Client("j"), nil); err == nil || !strings.Contains(err.Error(), "plain http, and TLS is configured") {
			t.Fatalf("an http endpoint with TLS: %v", err)
		}
		if _, err := Connect([]string{ep}, nil, nil); err == nil || !strings.Contains(err.Error(), "needs the job's TLS material") {
			t.Fatalf("an https endpoint without TLS: %v", err)
		}
	})
	t.Run("a server of another job", func(t *testing.T) {
		other := set.Refused[3].Files
		o, err := StartEmbedded(ctx, EmbeddedOptions{Dir: t.TempDir(), TLS: pki.Files{CA: set.Good.CA, Cert: other.Cert, Key: other.Key}})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		u, _ := url.Parse(o.Endpoints()[0])
		_, err = Dial(ctx, o.Endpoints(), DialOptions{TLS: peer.Client("j"), Wait: 2 * time.Second, Every: time.Hour})
		if err == nil || !strings.Contains(err.Error(), "TLS with "+u.Host) || !strings.Contains(err.Error(), `is for job "other-job", not "j"`) {
			t.Fatalf("a client of job j dialing a server of another job: %v", err)
		}
	})
}
