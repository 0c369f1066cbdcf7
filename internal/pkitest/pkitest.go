// Package pkitest makes the TLS material tests of every plane need: a
// job's CA and two certificates of the job, and the peers each plane must
// refuse (no certificate, another CA, expired, another job), as files. It
// is test infrastructure.
package pkitest

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/phalanx-rt/phalanx/pki"
)

// Set is a job's material in a test's directory.
type Set struct {
	Job string
	// Good and Peer are two certificates of the job, for 127.0.0.1.
	Good, Peer pki.Files
	// Refused are peers the job's planes must refuse.
	Refused []Refused
}

// Refused is a peer a plane must refuse: its files (none for "no
// certificate") and what a Phalanx listener's refusal says.
type Refused struct {
	Name   string
	Files  pki.Files
	Reason string
}

// New makes job's CA and certificates, another CA's, an expired one and
// one of another job ("other-job"), in t's temporary directory.
func New(t testing.TB, job string) *Set {
	t.Helper()
	now := time.Now()
	dir := t.TempDir()
	ca, err := pki.NewCA("test CA of "+job, now.Add(-24*time.Hour), 72*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("another CA", now.Add(-24*time.Hour), 72*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s := &Set{Job: job}
	s.Good = write(t, dir, ca, ca, "good", job, now, 24*time.Hour)
	s.Peer = write(t, dir, ca, ca, "peer", job, now, 24*time.Hour)
	s.Refused = []Refused{
		{Name: "no certificate", Reason: "didn't provide a certificate"},
		{Name: "another CA", Files: write(t, dir, other, ca, "stranger", job, now, 24*time.Hour), Reason: "not signed by this job's CA"},
		{Name: "expired", Files: write(t, dir, ca, ca, "expired", job, now.Add(-3*time.Hour), time.Hour), Reason: `certificate "expired" expired at`},
		{Name: "another job", Files: write(t, dir, ca, ca, "other", "other-job", now, 24*time.Hour), Reason: `is for job "other-job", not "` + job + `"`},
	}
	return s
}

// write issues name's certificate of job with ca at issued, and writes
// it with trust (the CA file the holder is given) under dir.
func write(t testing.TB, dir string, ca, trust *pki.CA, name, job string, issued time.Time, validity time.Duration) pki.Files {
	t.Helper()
	l, err := ca.Issue(name, job, []string{"127.0.0.1", "localhost"}, issued, validity)
	if err != nil {
		t.Fatal(err)
	}
	f := pki.Files{CA: filepath.Join(dir, name+"-ca.pem"), Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	for _, w := range []struct {
		path string
		data []byte
	}{{f.CA, trust.CertPEM()}, {f.Cert, l.Cert}, {f.Key, l.Key}} {
		if err := os.WriteFile(w.path, w.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// Client is a dialer's TLS configuration presenting f's certificate (none
// when f names no file) without checking the server: it tests the
// server's check of the client, as a peer that does not check would.
func Client(t testing.TB, f pki.Files) *tls.Config {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if f.Enabled() {
		c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		// Presented whatever CAs the server names as acceptable (Go's
		// client would otherwise send none of another CA's).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	return cfg
}

// KeyBody is the base64 body of f's key PEM: what must appear in no log.
func KeyBody(t testing.TB, f pki.Files) []string {
	t.Helper()
	b, err := os.ReadFile(f.Key)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && l[0] != '-' {
			lines = append(lines, l)
		}
	}
	return lines
}

// Logged is a log line a test reads: its message and fields.
type Logged struct {
	Message string
	Fields  map[string]any
}

// Logger is a logger whose warnings and errors the test reads from the
// channel (buffered; a line that finds it full is dropped).
func Logger() (*zap.Logger, <-chan Logged) {
	ch := make(chan Logged, 256)
	return zap.New(&chanCore{LevelEnabler: zapcore.WarnLevel, ch: ch}), ch
}

// chanCore sends each entry with its fields to ch.
type chanCore struct {
	zapcore.LevelEnabler
	fields []zapcore.Field
	ch     chan Logged
}

func (c *chanCore) With(f []zapcore.Field) zapcore.Core {
	return &chanCore{LevelEnabler: c.LevelEnabler, fields: append(append([]zapcore.Field(nil), c.fields...), f...), ch: c.ch}
}

func (c *chanCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *chanCore) Write(e zapcore.Entry, f []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, x := range append(append([]zapcore.Field(nil), c.fields...), f...) {
		x.AddTo(enc)
	}
	select {
	case c.ch <- Logged{Message: e.Message, Fields: enc.Fields}:
	default:
	}
	return nil
}

func (c *chanCore) Sync() error { return nil }

// Refusal waits for a logged refusal whose message contains msg and
// whose reason contains reason, and returns its peer; past the deadline
// it fails the test, listing what was logged.
func Refusal(t testing.TB, logs <-chan Logged, msg, reason string, within time.Duration) string {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	var seen []string
	for {
		select {
		case l := <-logs:
			r, _ := l.Fields["reason"].(string)
			if strings.Contains(l.Message, msg) && strings.Contains(r, reason) {
				p, _ := l.Fields["peer"].(string)
				return p
			}
			seen = append(seen, fmt.Sprintf("%s %v", l.Message, l.Fields))
		case <-timer.C:
			t.Fatalf("no refusal %q with reason %q logged within %v; logged: %q", msg, reason, within, seen)
			return ""
		}
	}
}

// Load is f's material for job (pki.Load), failing the test on an error.
func Load(t testing.TB, f pki.Files, job string) *pki.Material {
	t.Helper()
	m, err := pki.Load(f, job, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
