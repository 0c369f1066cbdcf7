package collective

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/pki"
)

// tlsOf is the job's mutual TLS for a process with files f, at now.
func tlsOf(t *testing.T, f pki.Files, job string, now time.Time) *TLSConfigs {
	t.Helper()
	m, err := pki.Load(f, job, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	return &TLSConfigs{Server: m.Server(job), Client: m.Client(job)}
}

// TestTLSDataPlane: two ranks of the job with certificates of its CA
// connect over mutual TLS and reduce; every peer the issue names is
// refused on the acceptor's side with the reason and the peer's address
// (a plaintext peer, one of another CA, an expired one, one of another
// job, one with no certificate), and the dialer's error names the rank,
// its address and the reason. A plaintext dialer is told TLS is required.
func TestTLSDataPlane(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA("ca", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("other", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	good := tlsOf(t, issue(t, ca, "a", "j", 48*time.Hour), "j", now)
	noCert := &TLSConfigs{Client: &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}}
	checksNothing := func(c *TLSConfigs) *TLSConfigs {
		c.Client = c.Client.Clone()
		c.Client.VerifyPeerCertificate = nil // would refuse the acceptor too: here the acceptor's check is tested
		return c
	}
	tests := []struct {
		name     string
		acceptor *TLSConfigs
		dialer   *TLSConfigs
		dialErr  string // in the dialer's error ("": connected)
		refusal  string // in the acceptor's last refusal
	}{
		{"the job's", good, tlsOf(t, issue(t, ca, "b", "j", 48*time.Hour), "j", now), "", ""},
		{"a plaintext peer", good, nil, "requires mutual TLS", "a plaintext peer"},
		{"a TLS peer of a plaintext rank", nil, good, "does not speak TLS", "a TLS peer, and this rank's data plane has no TLS configured"},
		{"another CA", good, checksNothing(tlsOf(t, issue(t, other, "b", "j", 48*time.Hour), "j", now)), "it refused this rank's certificate", `not signed by this job's CA`},
		{"another CA, as the dialer sees it", tlsOf(t, issue(t, other, "b", "j", 48*time.Hour), "j", now), good, `not signed by this job's CA`, ""},
		{"expired", tlsOf(t, issue(t, ca, "a", "j", 48*time.Hour), "j", now.Add(2*time.Hour)),
			checksNothing(tlsOf(t, issue(t, ca, "short", "j", time.Hour), "j", now)), "it refused this rank's certificate", `certificate "short" expired at`},
		{"another job", good, checksNothing(tlsOf(t, issue(t, ca, "b", "k", 48*time.Hour), "k", now)), "it refused this rank's certificate", `is for job "k", not "j"`},
		{"no certificate", good, noCert, "it refused this rank's certificate", "didn't provide a certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			acc, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0", Job: "j", TLS: tc.acceptor, HandshakeTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer acc.Close()
			dial, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0", Job: "j", TLS: tc.dialer})
			if err != nil {
				t.Fatal(err)
			}
			defer dial.Close()
			peers := []string{acc.Addr(), dial.Addr()}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			var accErr error
			groups := make([]*Group, 2)
			actx, acancel := context.WithCancel(ctx)
			defer acancel()
			wg.Add(1)
			go func() { // the acceptor waits for rank 1 while the case runs
				defer wg.Done()
				groups[0], accErr = Join(actx, acc, Membership{Job: "j", Generation: 1, Rank: 0, Peers: peers}, Options{Timeout: 5 * time.Second})
			}()
			var dialErr error
			groups[1], dialErr = Join(ctx, dial, Membership{Job: "j", Generation: 1, Rank: 1, Peers: peers}, Options{Timeout: 5 * time.Second})
			if dialErr != nil {
				acancel() // rank 1 will not come
			}
			wg.Wait()
			defer CloseGroups(groups)
			if tc.dialErr == "" {
				if dialErr != nil || accErr != nil {
					t.Fatalf("the job's ranks: %v; %v", dialErr, accErr)
				}
				// Two elements travel in one small frame; 3 MiB and 3
				// elements in segments of 1 MiB, each a frame's header and
				// payload sealed into records sent in batches (tlsConn).
				for _, n := range []int{2, 3<<18 + 3} {
					mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
						x := make([]float32, n)
						for i := range x {
							x[i] = float32(r+1) * float32(i%1000)
						}
						if err := g.AllReduce(ctx, Float32s(x), Sum); err != nil {
							return err
						}
						for i, v := range x {
							if want := 3 * float32(i%1000); v != want {
								return fmt.Errorf("%d elements over TLS: element %d is %v, want %v", n, i, v, want)
							}
						}
						return nil
					}))
				}
				return
			}
			if dialErr == nil || !strings.Contains(dialErr.Error(), tc.dialErr) || !strings.Contains(dialErr.Error(), acc.Addr()) {
				t.Errorf("the dialer: %v, want an error naming %s and %q", dialErr, acc.Addr(), tc.dialErr)
			}
			if tc.refusal != "" {
				// The refusal is recorded once the acceptor's handshake
				// returns, which may be after the dialer read its alert.
				var got string
				for deadline := time.After(10 * time.Second); ; {
					acc.mu.Lock()
					changed := acc.changed
					got = acc.lastReject
					acc.mu.Unlock()
					if got != "" {
						break
					}
					select {
					case <-changed:
					case <-deadline:
						t.Fatal("waited 10s for the acceptor's refusal")
					}
				}
				if !strings.Contains(got, tc.refusal) || !strings.Contains(got, "refused data-plane connection from 127.0.0.1:") {
					t.Errorf("the acceptor's refusal %q, want one naming the peer and %q", got, tc.refusal)
				}
			}
		})
	}
}

// issue writes a certificate of ca for job, and ca's own, into a
// directory of the test's.
func issue(t *testing.T, ca *pki.CA, name, job string, validity time.Duration) pki.Files {
	t.Helper()
	l, err := ca.Issue(name, job, []string{"127.0.0.1"}, time.Now(), validity)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	for p, b := range map[string][]byte{f.CA: ca.CertPEM(), f.Cert: l.Cert, f.Key: l.Key} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// BenchmarkTLSAllReduce: a 16 MiB allreduce of two ranks over the TCP
// transport, plaintext against mutual TLS (the ratio of the two is the
// figure: TLS 1.3's AES-128-GCM, with AES-NI).
func BenchmarkTLSAllReduce(b *testing.B) {
	now := time.Now()
	ca, err := pki.NewCA("ca", now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"plaintext", "tls"} {
		b.Run(mode, func(b *testing.B) {
			trs := make([]*TCPTransport, 2)
			for r := range trs {
				var cfg *TLSConfigs
				if mode == "tls" {
					cfg = benchTLS(b, ca, fmt.Sprintf("r%d", r), now)
				}
				tr, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0", Job: "j", TLS: cfg})
				if err != nil {
					b.Fatal(err)
				}
				defer tr.Close()
				trs[r] = tr
			}
			peers := []string{trs[0].Addr(), trs[1].Addr()}
			ctx := testContext(b)
			groups := make([]*Group, 2)
			errs := make(chan error, 2)
			for r := range groups {
				go func() {
					var err error
					groups[r], err = Join(ctx, trs[r], Membership{Job: "j", Generation: 1, Rank: r, Peers: peers}, Options{})
					errs <- err
				}()
			}
			for range groups {
				if err := testwait.Recv(b, errs, time.Minute, "a rank's join"); err != nil {
					b.Fatal(err)
				}
			}
			defer CloseGroups(groups)
			const size = 16 << 20
			bufs := [][]float32{make([]float32, size/4), make([]float32, size/4)}
			start := make(chan struct{}, 1)
			done := make(chan error, 1)
			go func() {
				for range start {
					done <- groups[1].AllReduceWith(ctx, Float32s(bufs[1]), Sum, AlgoRing)
				}
			}()
			defer close(start)
			b.SetBytes(size)
			cpu0 := cpuTime(b)
			b.ResetTimer()
			for b.Loop() {
				start <- struct{}{}
				if err := groups[0].AllReduceWith(ctx, Float32s(bufs[0]), Sum, AlgoRing); err != nil {
					b.Fatal(err)
				}
				if err := testwait.Recv(b, done, time.Minute, "rank 1's allreduce"); err != nil {
					b.Fatal(err)
				}
			}
			// The machine's other load changes the time, less the CPU spent.
			b.ReportMetric((cpuTime(b)-cpu0).Seconds()*1e3/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the CPU time this process has spent, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchTLS is a rank's mutual TLS with a fresh certificate of ca.
func benchTLS(b *testing.B, ca *pki.CA, name string, now time.Time) *TLSConfigs {
	l, err := ca.Issue(name, "j", []string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	f := pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "c.pem"), Key: filepath.Join(dir, "k.pem")}
	for p, v := range map[string][]byte{f.CA: ca.CertPEM(), f.Cert: l.Cert, f.Key: l.Key} {
		if err := os.WriteFile(p, v, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	m, err := pki.Load(f, "j", nil)
	if err != nil {
		b.Fatal(err)
	}
	return &TLSConfigs{Server: m.Server("j"), Client: m.Client("j")}
}
