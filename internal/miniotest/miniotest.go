// Package miniotest runs a real MinIO server for tests: on a loopback port
// chosen at run time, with a temporary data directory, stopped by PID.
//
// The binary is found at $PHALANX_MINIO, on PATH, or in $(go env GOPATH)/bin
// (scripts/install-minio puts it there). Without it a test is skipped with a
// loud message, except in CI (CI=true), where its absence fails the test.
package miniotest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Server is a running MinIO.
type Server struct {
	Endpoint  string // 127.0.0.1:port
	AccessKey string
	SecretKey string
	dir       string
	bin       string
	cmd       *exec.Cmd
	exited    chan struct{}
	t         testing.TB
}

// Binary returns the MinIO binary's path, or "" when there is none.
func Binary() string {
	if p := os.Getenv("PHALANX_MINIO"); p != "" {
		return p
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(string(trimNL(out)), "bin", "minio")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Start runs a MinIO server for the test and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		msg := "MinIO server binary not found: run scripts/install-minio (or set PHALANX_MINIO)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("SKIPPING (no MinIO): " + msg)
	}
	s := &Server{AccessKey: "phalanx-test", SecretKey: "phalanx-test-secret", dir: t.TempDir(), bin: bin, t: t}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Endpoint = l.Addr().String()
	l.Close()
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	cmd := exec.Command(s.bin, "server", s.dir, "--address", s.Endpoint, "--console-address", "127.0.0.1:0", "--quiet")
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+s.AccessKey, "MINIO_ROOT_PASSWORD="+s.SecretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "CI=")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting MinIO: %v", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(60 * time.Second); err != nil {
		s.Stop()
		s.t.Fatal(err)
	}
}

// waitReady polls MinIO's readiness endpoint until it answers 200.
func (s *Server) waitReady(limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	url := "http://" + s.Endpoint + "/minio/health/ready"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("MinIO exited before it was ready (port %s)", s.Endpoint)
		case <-ctx.Done():
			return fmt.Errorf("MinIO at %s not ready within %v: %v", s.Endpoint, limit, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop kills the server (SIGKILL by PID) and waits for it.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Restart starts the server again on the same port and data.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// URL is a checkpoint location in bucket/prefix on this server.
func (s *Server) URL(bucketAndPrefix string) string {
	return "s3://" + bucketAndPrefix + "?endpoint=" + s.Endpoint
}

// Env is the environment that gives a client this server's credentials.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}
