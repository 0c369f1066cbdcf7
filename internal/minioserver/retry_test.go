package minioserver

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestFirstStartMovesOffATakenPort: the endpoint New chose, taken by
// another process before the server binds it, makes the first start's
// process exit; the start is tried again on another port and serves
// there (Endpoint says where). Once a start has succeeded, a restart on a
// taken port is not moved: it fails, the endpoint unchanged. The server
// is a stand-in that serves the health path (python3's http.server).
func TestFirstStartMovesOffATakenPort(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3 is missing under CI: %v", err)
		}
		t.Skip("SKIPPING (no python3 for the stand-in server): ", err)
	}
	dir := t.TempDir()
	web := filepath.Join(dir, "web")
	if err := os.MkdirAll(filepath.Join(web, "minio", "health"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(web, healthPath[1:]), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Called as MinIO is: server DIR --address HOST:PORT --console-address ... --quiet.
	bin := filepath.Join(dir, "fake-minio")
	script := "#!/bin/sh\nexec " + py + " -m http.server --bind 127.0.0.1 --directory " + web + " \"${4##*:}\"\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	hold := func(addr string) net.Listener {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	s, err := New(Config{Binary: bin, Dir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	taken := hold("127.0.0.1:0")
	defer taken.Close()
	s.cfg.Endpoint = taken.Addr().String() // as if another process took New's choice
	picks := 0
	s.pick = func() (string, error) { picks++; return loopbackPort() }
	if _, err := s.Start(ctx); err != nil {
		t.Fatalf("a first start on a taken port: %v", err)
	}
	defer s.Stop()
	if picks != 1 || s.Endpoint() == taken.Addr().String() {
		t.Fatalf("%d ports picked, serving on %s (taken: %s); want one pick and another port", picks, s.Endpoint(), taken.Addr())
	}
	resp, err := http.Get("http://" + s.Endpoint() + healthPath)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health on %s: %v %v", s.Endpoint(), resp, err)
	}
	resp.Body.Close()

	at := s.Endpoint()
	s.Stop()
	again := hold(at)
	defer again.Close()
	if _, err := s.Start(ctx); !errors.Is(err, ErrExited) || s.Endpoint() != at || picks != 1 {
		t.Errorf("a restart on its taken port: %v, now on %s after %d picks; want ErrExited, still on %s", err, s.Endpoint(), picks, at)
	}
}
