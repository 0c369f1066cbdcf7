// Package pki is a job's mutual TLS: the PEM files a process is given
// (a CA, its certificate and key), the TLS configurations every plane uses
// (both sides present a certificate of the job's CA, and each checks the
// other's names the job), and a development CA that issues them
// (phalanx certs init, the launcher's --tls auto).
//
// A certificate names the job it may join in a URI SAN,
// phalanx://job/<name>: a certificate of another job is refused even under
// the same CA. Host names are not checked: the identity that admits a
// peer is the CA's signature and the job, as every member of a job is a
// peer of every other (etcd's client-certificate auth works the same way).
package pki

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"
)

// Scheme and Host make the URI a certificate names its job with:
// phalanx://job/<name>.
const (
	Scheme = "phalanx"
	Host   = "job"
)

// JobURI is the URI SAN of a certificate of job.
func JobURI(job string) *url.URL {
	return &url.URL{Scheme: Scheme, Host: Host, Path: "/" + job}
}

// JobCN is the common name of a certificate of job: the name etcd's
// client-certificate auth checks (its AllowedCNs), and its user when etcd
// auth is on. The host a certificate was issued for is its
// organizational unit.
func JobCN(job string) string { return "phalanx-job:" + job }

// nameOf is how messages name a certificate: its host, else its common
// name.
func nameOf(c *x509.Certificate) string {
	if len(c.Subject.OrganizationalUnit) > 0 {
		return c.Subject.OrganizationalUnit[0]
	}
	return c.Subject.CommonName
}

// JobsOf are the jobs a certificate's URI SANs name.
func JobsOf(c *x509.Certificate) []string {
	var jobs []string
	for _, u := range c.URIs {
		if u.Scheme == Scheme && u.Host == Host && len(u.Path) > 1 {
			jobs = append(jobs, strings.TrimPrefix(u.Path, "/"))
		}
	}
	return jobs
}

// Files names a process's TLS material: PEM files of the CA that signs
// every certificate of the job, of this process's certificate (with any
// intermediates after it) and of its private key. All three or none.
type Files struct {
	CA   string `json:"ca,omitempty"`
	Cert string `json:"cert,omitempty"`
	Key  string `json:"key,omitempty"`
}

// Enabled says whether any file is named.
func (f Files) Enabled() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Validate checks that all three files are named, or none.
func (f Files) Validate() error {
	if !f.Enabled() || f.CA != "" && f.Cert != "" && f.Key != "" {
		return nil
	}
	var missing []string
	for _, m := range []struct{ name, v string }{{"CA", f.CA}, {"certificate", f.Cert}, {"key", f.Key}} {
		if m.v == "" {
			missing = append(missing, m.name)
		}
	}
	return fmt.Errorf("pki: TLS needs a CA, a certificate and a key; missing the %s", strings.Join(missing, " and the "))
}

// Material is a process's loaded TLS material.
type Material struct {
	pool *x509.CertPool
	cert tls.Certificate
	leaf *x509.Certificate
	now  func() time.Time
}

// Load reads f and checks what it can alone: the key matches the
// certificate, which chains to the CA, is valid now, and names job (the
// process's own job: a process given another job's certificate is told
// at once, not by its peers' refusals; "": any job, which it must name).
// now is the clock (nil: time.Now).
func Load(f Files, job string, now func() time.Time) (*Material, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if !f.Enabled() {
		return nil, errors.New("pki: no TLS files named")
	}
	if now == nil {
		now = time.Now
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("pki: the CA: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := caPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("pki: the CA %s: %w", f.CA, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("pki: the CA %s holds no PEM certificate", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		// The key's bytes never reach the message: crypto/tls names the
		// problem ("private key does not match public key"), not the key.
		return nil, fmt.Errorf("pki: the certificate %s and key %s: %w", f.Cert, f.Key, err)
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("pki: the certificate %s: %w", f.Cert, err)
		}
	}
	m := &Material{pool: pool, cert: cert, leaf: leaf, now: now}
	if job == "" { // any job the certificate names: an etcd member may serve several
		if jobs := JobsOf(leaf); len(jobs) > 0 {
			job = jobs[0]
		}
	}
	if err := m.verify(cert.Certificate, job); err != nil {
		return nil, fmt.Errorf("pki: this process's certificate %s: %w", f.Cert, err)
	}
	return m, nil
}

// Jobs are the jobs this process's certificate names.
func (m *Material) Jobs() []string { return JobsOf(m.leaf) }

// Leaf is this process's certificate.
func (m *Material) Leaf() *x509.Certificate { return m.leaf }

// Pool is the CA pool.
func (m *Material) Pool() *x509.CertPool { return m.pool }

// Certificate is this process's certificate and key, for a TLS config.
func (m *Material) Certificate() tls.Certificate { return m.cert }

// verify checks a peer's chain (raw DER, leaf first): signed by the CA,
// valid now, for both client and server use, and naming job.
func (m *Material) verify(raw [][]byte, job string) error {
	if len(raw) == 0 {
		return errors.New("no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, b := range raw {
		c, err := x509.ParseCertificate(b)
		if err != nil {
			return fmt.Errorf("a malformed certificate: %w", err)
		}
		certs[i] = c
	}
	leaf := certs[0]
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	now := m.now()
	if now.After(leaf.NotAfter) {
		return fmt.Errorf("certificate %q expired at %s", nameOf(leaf), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(leaf.NotBefore) {
		return fmt.Errorf("certificate %q is not valid before %s", nameOf(leaf), leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}}); err != nil {
		var ua x509.UnknownAuthorityError
		if errors.As(err, &ua) {
			return fmt.Errorf("certificate %q is not signed by this job's CA (issuer %q)", nameOf(leaf), leaf.Issuer.CommonName)
		}
		return fmt.Errorf("certificate %q: %w", nameOf(leaf), err)
	}
	jobs := JobsOf(leaf)
	for _, j := range jobs {
		if j == job {
			return nil
		}
	}
	if len(jobs) == 0 {
		return fmt.Errorf("certificate %q names no job (a URI SAN %s)", nameOf(leaf), JobURI(job))
	}
	return fmt.Errorf("certificate %q is for job %s, not %q", nameOf(leaf), quoteAll(jobs), job)
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// Server is the TLS configuration of a listener of job: TLS 1.3, a client
// certificate required, and admitted only if it is the job's (see
// verify). A refusal's error names the reason; the listener names the peer.
func (m *Material) Server(job string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{m.cert},
		// Bulk transfers: full-size records from the first byte.
		DynamicRecordSizingDisabled: true,
		ClientAuth:                  tls.RequireAnyClientCert, // verified below, with the job
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if err := m.verify(raw, job); err != nil {
				return &PeerError{Reason: err.Error()}
			}
			return nil
		},
	}
}

// Client is the TLS configuration of a dialer into job: TLS 1.3, this
// process's certificate presented, and the server's admitted only if it
// is the job's (see verify; no host name is checked).
func (m *Material) Client(job string) *tls.Config {
	return &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		Certificates:                []tls.Certificate{m.cert},
		DynamicRecordSizingDisabled: true,
		InsecureSkipVerify:          true, // the chain and the job are verified below, the host name not at all
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if err := m.verify(raw, job); err != nil {
				return &PeerError{Reason: err.Error()}
			}
			return nil
		},
	}
}

// PeerError is a peer's certificate refused: Reason says why.
type PeerError struct{ Reason string }

func (e *PeerError) Error() string { return "refused the peer's certificate: " + e.Reason }
