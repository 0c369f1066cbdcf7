package minioserver_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/phalanx-rt/phalanx/internal/minioserver"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
)

// testWait bounds each test's calls to its server: far above what a loaded
// machine needs, far below go test's timeout.
const testWait = 2 * time.Minute

// TestBinaryMissing: a PHALANX_MINIO naming no file is ErrNoBinary, with
// the path and the install hint in the message.
func TestBinaryMissing(t *testing.T) {
	t.Setenv("PHALANX_MINIO", "/nonexistent/minio")
	_, err := minioserver.Binary()
	if !errors.Is(err, minioserver.ErrNoBinary) || !strings.Contains(err.Error(), "/nonexistent/minio") ||
		!strings.Contains(err.Error(), "scripts/install-minio") {
		t.Fatalf("Binary: %v, want ErrNoBinary naming the path and scripts/install-minio", err)
	}
	if _, err := minioserver.New(minioserver.Config{Dir: t.TempDir()}); !errors.Is(err, minioserver.ErrNoBinary) {
		t.Fatalf("New without a binary: %v, want ErrNoBinary", err)
	}
}

// TestElsewhereNeedsEndpoint: a server started by Config.Command or
// probed through Config.Dial (in a network namespace, say) has no free
// port New could pick: it must be given its Endpoint.
func TestElsewhereNeedsEndpoint(t *testing.T) {
	for name, cfg := range map[string]minioserver.Config{
		"Command": {Command: exec.CommandContext},
		"Dial":    {Dial: (&net.Dialer{}).DialContext},
	} {
		cfg.Binary, cfg.Dir = "/nonexistent/minio", t.TempDir()
		if _, err := minioserver.New(cfg); err == nil || !strings.Contains(err.Error(), "needs an Endpoint") {
			t.Errorf("New with %s and no Endpoint: %v, want an error saying it needs one", name, err)
		}
		cfg.Endpoint = "10.250.0.1:9000"
		if s, err := minioserver.New(cfg); err != nil || s.Endpoint() != cfg.Endpoint {
			t.Errorf("New with %s and an Endpoint: %v", name, err)
		}
	}
}

// TestStartStopRestart: a real MinIO starts healthy on a loopback port,
// goes away (stopped, killed, or stopped while paused), and started again
// on the same port and data serves the object written before.
func TestStartStopRestart(t *testing.T) {
	bin := miniotest.RequireBinary(t)
	for _, tc := range []struct {
		name string
		down func(ctx context.Context, s *minioserver.Server, pid int) error
	}{
		{"stop", func(_ context.Context, s *minioserver.Server, _ int) error { s.Stop(); return nil }},
		{"kill", func(ctx context.Context, s *minioserver.Server, pid int) error {
			got, err := s.Kill(ctx)
			if err == nil && got != pid {
				return errors.New("Kill returned another pid")
			}
			return err
		}},
		{"stop while paused", func(_ context.Context, s *minioserver.Server, pid int) error {
			if got, err := s.Signal(syscall.SIGSTOP); err != nil || got != pid {
				return errors.Join(errors.New("SIGSTOP"), err)
			}
			s.Stop()
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), testWait)
			defer cancel()
			s, err := minioserver.Start(ctx, minioserver.Config{Binary: bin, Dir: filepath.Join(t.TempDir(), "data"), Output: os.Stderr})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Stop)
			pid := s.Pid()
			if pid == 0 || !strings.HasPrefix(s.Endpoint(), "127.0.0.1:") {
				t.Fatalf("pid %d, endpoint %q: want a running server on loopback", pid, s.Endpoint())
			}
			if code := health(ctx, t, s.Endpoint()); code != http.StatusOK {
				t.Fatalf("health: %d, want 200", code)
			}

			c := client(t, s)
			want := []byte("kept across restarts: " + tc.name)
			if err := c.MakeBucket(ctx, "kept", minio.MakeBucketOptions{}); err != nil {
				t.Fatalf("making the bucket: %v", err)
			}
			if _, err := c.PutObject(ctx, "kept", "o", bytes.NewReader(want), int64(len(want)), minio.PutObjectOptions{}); err != nil {
				t.Fatalf("putting the object: %v", err)
			}

			if err := tc.down(ctx, s, pid); err != nil {
				t.Fatal(err)
			}
			if got := s.Pid(); got != 0 {
				t.Fatalf("Pid after it went down: %d, want 0", got)
			}
			if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Fatalf("process %d after it went down: %v, want gone", pid, err)
			}
			if _, err := s.Signal(syscall.SIGCONT); err == nil {
				t.Fatal("Signal to a stopped server: no error")
			}

			pid2, err := s.Start(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if pid2 == pid || s.Pid() != pid2 {
				t.Fatalf("restart: pid %d (Pid %d), first %d: want a new process", pid2, s.Pid(), pid)
			}
			if _, err := s.Start(ctx); err == nil {
				t.Fatal("Start while running: no error")
			}
			obj, err := c.GetObject(ctx, "kept", "o", minio.GetObjectOptions{})
			if err != nil {
				t.Fatalf("getting the object after the restart: %v", err)
			}
			got, err := io.ReadAll(obj)
			obj.Close()
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("object after restart: %q, %v; want %q", got, err, want)
			}
		})
	}
}

// TestStartFails: a process that exits, or never answers healthy before
// the deadline, is an error saying so, and is not left running.
func TestStartFails(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		wait         time.Duration // Config.ReadyWait (0: the default minute)
		want         error
		says         string
	}{
		{"exits", "exit 3", 0, minioserver.ErrExited, "exited"},
		{"never healthy", "exec sleep 600", 200 * time.Millisecond, context.DeadlineExceeded, "/minio/health/ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "fake-minio")
			if err := os.WriteFile(bin, []byte("#!/bin/sh\n"+tc.script+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			s, err := minioserver.New(minioserver.Config{Binary: bin, Dir: t.TempDir(), ReadyWait: tc.wait})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), testWait)
			defer cancel()
			_, err = s.Start(ctx)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), s.Endpoint()) {
				t.Fatalf("Start: %v; want %v saying %q and the endpoint", err, tc.want, tc.says)
			}
			if pid := s.Pid(); pid != 0 {
				t.Fatalf("Pid after a failed start: %d, want 0", pid)
			}
		})
	}
}

func health(ctx context.Context, t *testing.T, endpoint string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/minio/health/live", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("health of %s: %v", endpoint, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func client(t *testing.T, s *minioserver.Server) *minio.Client {
	t.Helper()
	ak, sk := s.Credentials()
	c, err := minio.New(s.Endpoint(), &minio.Options{Creds: credentials.NewStaticV4(ak, sk, "")})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
