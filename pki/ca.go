package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// CA is a development certificate authority: a self-signed ECDSA P-256
// certificate and its key, in memory.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

// NewCA makes a CA named name, valid from now for validity.
func NewCA(name string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: a CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"phalanx"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, der: der}, nil
}

// Leaf is a certificate the CA issued and its key, PEM encoded.
type Leaf struct {
	Cert, Key []byte
}

// Issue makes a certificate for name (its organizational unit; its common
// name is JobCN(job)), usable as a TLS client and server,
// naming job (URI SAN phalanx://job/<job>) and hosts (IP addresses and DNS
// names, for tools that check them: etcd's peers do), valid from now for
// validity (capped at the CA's own end).
func (ca *CA) Issue(name, job string, hosts []string, now time.Time, validity time.Duration) (Leaf, error) {
	if job == "" {
		return Leaf{}, errors.New("pki: a certificate must name its job")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, fmt.Errorf("pki: a key: %w", err)
	}
	end := now.Add(validity)
	if end.After(ca.cert.NotAfter) {
		end = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: JobCN(job), OrganizationalUnit: []string{name}, Organization: []string{"phalanx"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     end,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{JobURI(job)},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Leaf{}, fmt.Errorf("pki: the certificate of %s: %w", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Leaf{}, err
	}
	return Leaf{Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})}, nil
}

// CertPEM is the CA's certificate, PEM encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der})
}

// KeyPEM is the CA's key, PEM encoded.
func (ca *CA) KeyPEM() ([]byte, error) {
	kder, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

// InitOptions are what Init makes.
type InitOptions struct {
	Job      string   // the job every certificate names
	Hosts    []string // one certificate per host (its name or address, also in its SANs)
	Now      time.Time
	Validity time.Duration // each certificate's (the CA's is the same)
}

// Init writes a new development CA and a certificate per host into dir:
// ca.pem and ca-key.pem, and <host>.pem and <host>-key.pem for each host,
// keys 0600. dir may exist; no file in it is overwritten (an existing one
// is an error naming it, and nothing is written). It returns the files of
// each host, in order.
func Init(dir string, o InitOptions) ([]Files, error) {
	if len(o.Hosts) == 0 {
		return nil, errors.New("pki: name at least one host")
	}
	if o.Job == "" {
		return nil, errors.New("pki: name the job the certificates are for")
	}
	seen := map[string]bool{}
	for _, h := range o.Hosts {
		switch {
		case h == "" || h != filepath.Base(h) || h == "ca" || h == "." || h == "..":
			return nil, fmt.Errorf("pki: %q cannot name a host's files", h)
		case seen[h]:
			return nil, fmt.Errorf("pki: host %q named twice", h)
		}
		seen[h] = true
	}
	ca, err := NewCA("phalanx development CA for job "+o.Job, o.Now, o.Validity)
	if err != nil {
		return nil, err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return nil, err
	}
	type file struct {
		name string
		data []byte
		mode fs.FileMode
	}
	files := []file{{"ca.pem", ca.CertPEM(), 0o644}, {"ca-key.pem", caKey, 0o600}}
	var out []Files
	for _, h := range o.Hosts {
		l, err := ca.Issue(h, o.Job, []string{h}, o.Now, o.Validity)
		if err != nil {
			return nil, err
		}
		files = append(files, file{h + ".pem", l.Cert, 0o644}, file{h + "-key.pem", l.Key, 0o600})
		out = append(out, Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, h+".pem"), Key: filepath.Join(dir, h+"-key.pem")})
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	for _, f := range files {
		if _, err := os.Lstat(filepath.Join(dir, f.name)); !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("pki: %s exists already; nothing was written (choose an empty directory)", filepath.Join(dir, f.name))
		}
	}
	var written []string
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := writeNew(p, f.data, f.mode); err != nil {
			for _, w := range slices.Backward(written) {
				os.Remove(w)
			}
			return nil, fmt.Errorf("pki: %w", err)
		}
		written = append(written, p)
	}
	return out, nil
}

// writeNew writes a file that must not exist (O_EXCL), synced.
func writeNew(path string, data []byte, mode fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
