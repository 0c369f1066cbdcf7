// Package miniotest runs a real MinIO server for tests (internal/minioserver)
// on a loopback port chosen at run time, with the test's temporary data
// directory, stopped by PID when the test ends.
//
// The binary is found as internal/minioserver finds it. Without it a test
// is skipped with a loud message, except in CI (CI=true), where its
// absence fails the test.
package miniotest

import (
	"os"
	"testing"

	"github.com/phalanx-rt/phalanx/internal/minioserver"
)

// Server is a running MinIO.
type Server struct {
	Endpoint  string // 127.0.0.1:port
	AccessKey string
	SecretKey string
	srv       *minioserver.Server
	t         testing.TB
}

// Binary returns the MinIO binary's path, or "" when there is none.
func Binary() string {
	p, _ := minioserver.Binary()
	return p
}

// RequireBinary returns the MinIO binary's path; without one it skips the
// test loudly, or fails it in CI (CI=true).
func RequireBinary(t testing.TB) string {
	t.Helper()
	bin, err := minioserver.Binary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip("SKIPPING (no MinIO): ", err)
	}
	return bin
}

// Start runs a MinIO server for the test and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	srv, err := minioserver.New(minioserver.Config{Binary: RequireBinary(t), Dir: t.TempDir(),
		AccessKey: "phalanx-test", SecretKey: "phalanx-test-secret", Output: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{srv: srv, t: t}
	s.AccessKey, s.SecretKey = srv.Credentials()
	s.start()
	s.Endpoint = srv.Endpoint() // where it serves: a first start may have moved off a port taken meanwhile
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	if _, err := s.srv.Start(s.t.Context()); err != nil {
		s.t.Fatal(err)
	}
}

// Pid is the server's process id (0: stopped).
func (s *Server) Pid() int { return s.srv.Pid() }

// Stop kills the server (SIGKILL by PID) and waits for it.
func (s *Server) Stop() { s.srv.Stop() }

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
