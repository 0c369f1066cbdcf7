package job

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/pki"
)

// Security is a process's mutual TLS on every plane: the data plane, the
// parameter servers', the actor remote and etcd. A nil *Security is
// plaintext, and its methods return nil configurations.
type Security struct {
	m   *pki.Material
	job string
}

// LoadSecurity loads c.TLS (nil, nil when no file is named). The
// certificate must name c.Job: a process given another job's is told at
// once, not by its peers' refusals.
func LoadSecurity(c *Config) (*Security, error) {
	if !c.TLS.Enabled() {
		return nil, nil
	}
	m, err := pki.Load(c.TLS, c.Job, c.Now)
	if err != nil {
		return nil, Invalid("TLS", c.TLS, "%v", err)
	}
	return &Security{m: m, job: c.Job}, nil
}

// Server is the TLS configuration of this process's listeners.
func (s *Security) Server() *tls.Config {
	if s == nil {
		return nil
	}
	return s.m.Server(s.job)
}

// Client is the TLS configuration of this process's dialers.
func (s *Security) Client() *tls.Config {
	if s == nil {
		return nil
	}
	return s.m.Client(s.job)
}

// Transport is the data plane's pair.
func (s *Security) Transport() *collective.TLSConfigs {
	if s == nil {
		return nil
	}
	return &collective.TLSConfigs{Server: s.Server(), Client: s.Client()}
}

// DialEtcd connects to the job's etcd (c.Etcd), over TLS when c.TLS names
// files, and waits for its first answer (coordinator.Dial).
func DialEtcd(ctx context.Context, c *Config, log *zap.Logger) (*clientv3.Client, error) {
	sec, err := LoadSecurity(c)
	if err != nil {
		return nil, err
	}
	return coordinator.Dial(ctx, c.Etcd, coordinator.DialOptions{Logger: log, Wait: c.EtcdDialTimeout, TLS: sec.Client()})
}

// ephemeralTLS makes a CA and one certificate of job for this host
// (127.0.0.1, ::1, localhost) in a new directory under parent, the key
// 0600: the material of a local job launched with TLS "auto". remove
// deletes the directory.
func ephemeralTLS(parent, job string, now time.Time) (f pki.Files, remove func(), err error) {
	dir, err := os.MkdirTemp(parent, "tls-")
	if err != nil {
		return f, nil, fmt.Errorf("phalanx: TLS auto: %w", err)
	}
	remove = func() { os.RemoveAll(dir) }
	ca, err := pki.NewCA("phalanx ephemeral CA for job "+job, now, 30*24*time.Hour)
	if err == nil {
		var leaf pki.Leaf
		if leaf, err = ca.Issue("localhost", job, []string{"127.0.0.1", "::1", "localhost"}, now, 30*24*time.Hour); err == nil {
			f = pki.Files{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "job.pem"), Key: filepath.Join(dir, "job-key.pem")}
			for _, w := range []struct {
				path string
				data []byte
				mode os.FileMode
			}{{f.CA, ca.CertPEM(), 0o644}, {f.Cert, leaf.Cert, 0o644}, {f.Key, leaf.Key, 0o600}} {
				if err = os.WriteFile(w.path, w.data, w.mode); err != nil {
					break
				}
			}
		}
	}
	if err != nil {
		remove()
		return pki.Files{}, nil, fmt.Errorf("phalanx: TLS auto: %w", err)
	}
	return f, remove, nil
}
