package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// material issues a certificate of ca for job into dir and loads it for
// job at now (skipping Load's own checks when the test wants a
// certificate this process would refuse of itself).
func material(t *testing.T, ca *CA, name, job string, issued time.Time, validity time.Duration, now time.Time) *Material {
	t.Helper()
	l, err := ca.Issue(name, job, []string{"127.0.0.1"}, issued, validity)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "c.pem"), Key: filepath.Join(dir, "k.pem")}
	for p, b := range map[string][]byte{f.CA: ca.CertPEM(), f.Cert: l.Cert, f.Key: l.Key} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cert, err := tls.X509KeyPair(l.Cert, l.Key)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(f, job, func() time.Time { return now })
	if err != nil {
		// A certificate the test means to be refused: build the material
		// by hand, as a misconfigured peer would present it.
		pool := x509.NewCertPool()
		pool.AddCert(ca.cert)
		m = &Material{pool: pool, cert: cert, leaf: cert.Leaf, now: func() time.Time { return now }}
	}
	return m
}

// handshake runs a TLS handshake between a client and a server config
// over loopback TCP (buffered: a refusal's alert never waits for the
// other side to read) and returns each side's error.
func handshake(t *testing.T, client, server *tls.Config) (cerr, serr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(10 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	done := make(chan error, 1)
	go func() {
		s := tls.Server(b, server)
		err := s.Handshake()
		if err == nil {
			// TLS 1.3: the server learns of a refused certificate of its
			// own only when the client's alert arrives.
			_, err = s.Read(make([]byte, 1))
		}
		b.Close()
		done <- err
	}()
	c := tls.Client(a, client)
	cerr = c.Handshake()
	if cerr == nil {
		_, cerr = c.Write([]byte{1})
	}
	a.Close()
	return cerr, <-done
}

// TestHandshakes: two processes of the job under its CA admit each other
// both ways; a certificate of another CA, an expired one, one of another
// job, one naming no job, and none at all are each refused by the side
// that checks it, with the reason.
func TestHandshakes(t *testing.T) {
	ca, err := NewCA("ca", t0, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("other", t0, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	good := material(t, ca, "a", "j", t0, time.Hour*2, now)
	tests := []struct {
		name string
		peer func() *tls.Config // the client's config; the server is good's
		want string             // in the server's error ("" : admitted)
	}{
		{"the same job", func() *tls.Config { return material(t, ca, "b", "j", t0, 2*time.Hour, now).Client("j") }, ""},
		{"another CA", func() *tls.Config { return material(t, other, "b", "j", t0, 2*time.Hour, now).Client("j") }, `not signed by this job's CA (issuer "other")`},
		{"expired", func() *tls.Config { return material(t, ca, "b", "j", t0, 30*time.Minute, now).Client("j") }, "expired at 2026-11-29T12:30:00Z"},
		{"another job", func() *tls.Config { return material(t, ca, "b", "k", t0, 2*time.Hour, now).Client("k") }, `is for job "k", not "j"`},
		{"no certificate", func() *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} }, "client didn't provide a certificate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			peer := tc.peer()
			peer.VerifyPeerCertificate = nil // it would refuse us too: here the server's check is tested
			_, serr := handshake(t, peer, good.Server("j"))
			switch {
			case tc.want == "" && serr != nil && !errors.Is(serr, net.ErrClosed) && !strings.Contains(serr.Error(), "EOF"):
				t.Fatalf("server refused a peer of the job: %v", serr)
			case tc.want != "" && (serr == nil || !strings.Contains(serr.Error(), tc.want)):
				t.Fatalf("server: %v, want a refusal saying %q", serr, tc.want)
			}
		})
	}
	// The client checks the server the same way.
	cerr, _ := handshake(t, good.Client("j"), material(t, ca, "b", "k", t0, 2*time.Hour, now).Server("k"))
	if cerr == nil || !strings.Contains(cerr.Error(), `is for job "k", not "j"`) {
		t.Fatalf("a client of job j dialing a server of job k: %v, want a refusal", cerr)
	}
	cerr, _ = handshake(t, good.Client("j"), material(t, other, "b", "j", t0, 2*time.Hour, now).Server("j"))
	if cerr == nil || !strings.Contains(cerr.Error(), "not signed by this job's CA") {
		t.Fatalf("a client dialing a server of another CA: %v, want a refusal", cerr)
	}
}

// TestInit: a CA and a certificate per host, keys readable by the owner
// alone, each loading for the job and refused for another; a second Init
// into the same directory writes nothing and changes nothing.
func TestInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	files, err := Init(dir, InitOptions{Job: "j", Hosts: []string{"10.0.0.1", "host-b"}, Now: t0, Validity: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return t0.Add(time.Hour) }
	for _, f := range files {
		m, err := Load(f, "j", now)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		if jobs := m.Jobs(); len(jobs) != 1 || jobs[0] != "j" {
			t.Errorf("%s names jobs %v, want [j]", f.Cert, jobs)
		}
		if st, err := os.Stat(f.Key); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", f.Key, st.Mode(), err)
		}
		if _, err := Load(f, "k", now); err == nil || !strings.Contains(err.Error(), `is for job "j", not "k"`) {
			t.Errorf("loading %s for job k: %v, want a refusal", f.Cert, err)
		}
	}
	if ips := files[0]; true {
		m, _ := Load(ips, "j", now)
		if len(m.Leaf().IPAddresses) != 1 || !m.Leaf().IPAddresses[0].Equal(net.ParseIP("10.0.0.1")) {
			t.Errorf("10.0.0.1's certificate has IP SANs %v", m.Leaf().IPAddresses)
		}
	}
	before := map[string][]byte{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		before[e.Name()], _ = os.ReadFile(filepath.Join(dir, e.Name()))
	}
	_, err = Init(dir, InitOptions{Job: "j", Hosts: []string{"host-c", "host-b"}, Now: t0, Validity: time.Hour})
	if err == nil || !strings.Contains(err.Error(), "exists already; nothing was written") {
		t.Fatalf("a second Init into %s: %v, want a refusal", dir, err)
	}
	ents, _ = os.ReadDir(dir)
	if len(ents) != len(before) {
		t.Errorf("%d files after the refused Init, want %d", len(ents), len(before))
	}
	for name, b := range before {
		if now, _ := os.ReadFile(filepath.Join(dir, name)); string(now) != string(b) {
			t.Errorf("%s changed by the refused Init", name)
		}
	}
}

// TestLoadRefusals: what a process can be told about its own material at
// once, each error naming the file and never carrying the key.
func TestLoadRefusals(t *testing.T) {
	dir := t.TempDir()
	files, err := Init(dir, InitOptions{Job: "j", Hosts: []string{"a", "b"}, Now: t0, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a, b := files[0], files[1]
	keyA, _ := os.ReadFile(a.Key)
	garbage := filepath.Join(dir, "garbage.pem")
	os.WriteFile(garbage, []byte("not a certificate"), 0o600)
	tests := []struct {
		name string
		f    Files
		at   time.Time
		want string
	}{
		{"a key of another certificate", Files{CA: a.CA, Cert: a.Cert, Key: b.Key}, t0, "private key does not match public key"},
		{"a CA that holds none", Files{CA: garbage, Cert: a.Cert, Key: a.Key}, t0, "holds no PEM certificate"},
		{"expired", a, t0.Add(2 * time.Hour), "expired at"},
		{"a certificate missing", Files{CA: a.CA, Key: a.Key}, t0, "missing the certificate"},
		{"no file", Files{CA: a.CA, Cert: filepath.Join(dir, "none.pem"), Key: a.Key}, t0, "none.pem"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.f, "j", func() time.Time { return tc.at })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load: %v, want an error saying %q", err, tc.want)
			}
			body := strings.Join(strings.Split(strings.TrimSpace(string(keyA)), "\n")[1:3], "")
			if strings.Contains(strings.ReplaceAll(err.Error(), "\n", ""), body) {
				t.Fatalf("the error carries a key: %v", err)
			}
		})
	}
}
