// Package minioserver runs a real MinIO server process: the binary
// scripts/install-minio installs, on a loopback port chosen at run time,
// with a data directory of the caller's, started, waited on until healthy,
// signalled by PID and started again on the same port and data. Given an
// endpoint, a command maker and a dialer (Config.Command, Config.Dial), it
// runs the server elsewhere, such as inside a network namespace.
//
// It is what the tests (internal/miniotest) and the chaos harness (chaos)
// share; it knows nothing of testing and is no MinIO client.
package minioserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoBinary: there is no MinIO server binary.
var ErrNoBinary = errors.New("MinIO server binary not found: run scripts/install-minio (or set PHALANX_MINIO)")

// ErrExited: the server process exited before it answered healthy.
var ErrExited = errors.New("MinIO exited before it was ready")

// DefaultReadyWait bounds how long a start may take to answer healthy
// when Config.ReadyWait is zero.
const DefaultReadyWait = time.Minute

// healthPath is MinIO's readiness endpoint: 200 once it serves requests.
const healthPath = "/minio/health/ready"

// Binary finds the MinIO server at $PHALANX_MINIO, on PATH, or in
// $(go env GOPATH)/bin, where scripts/install-minio puts it. Without one
// the error wraps ErrNoBinary.
func Binary() (string, error) {
	if p := os.Getenv("PHALANX_MINIO"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: PHALANX_MINIO=%s: %w", ErrNoBinary, p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("minio"); err == nil {
		return p, nil
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", "minio")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", ErrNoBinary
}

// Config says how to run a server. Dir is required; the rest have
// defaults.
type Config struct {
	Binary    string        // the server binary; "": Binary()
	Dir       string        // its data directory (created if absent)
	Endpoint  string        // host:port to serve on; "": a free loopback port
	AccessKey string        // root user; "": "phalanx"
	SecretKey string        // root password; "": a random one
	Output    io.Writer     // the server's stdout and stderr; nil: discarded
	ReadyWait time.Duration // how long a start may take to answer healthy; 0: DefaultReadyWait
	// Command makes the server's process (nil: exec.Command), for example
	// netns.Host.Command to run it inside a network namespace; the pid of
	// the command it returns must be the server's. Dial connects the
	// health probe to Endpoint (nil: a net.Dialer's), for a server this
	// process reaches only through such a namespace. With either set,
	// Endpoint is required: New cannot pick a free port elsewhere.
	Command func(ctx context.Context, name string, args ...string) *exec.Cmd
	Dial    func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Server is one MinIO server on a fixed endpoint and data directory; its
// process may be started, killed and started again any number of times.
// Its methods are safe for concurrent use.
type Server struct {
	cfg Config
	// auto: the endpoint was chosen by New, free when chosen; until the
	// first start succeeds, a start whose process exits (another process
	// took the port meanwhile) is tried again on another (pick's).
	auto, started bool
	pick          func() (string, error)

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil: not running
	exited chan struct{} // closed when cmd has exited
}

// New resolves cfg's defaults (the binary, a free loopback port, the
// credentials) and creates the data directory; it starts nothing.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("minioserver: no data directory")
	}
	if cfg.Binary == "" {
		bin, err := Binary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = bin
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("minioserver: data directory: %w", err)
	}
	auto := cfg.Endpoint == ""
	if auto && (cfg.Command != nil || cfg.Dial != nil) {
		return nil, errors.New("minioserver: a server started by Config.Command or probed through Config.Dial needs an Endpoint")
	}
	if cfg.Command == nil {
		cfg.Command = exec.CommandContext
	}
	if auto {
		var err error
		if cfg.Endpoint, err = loopbackPort(); err != nil {
			return nil, err
		}
	}
	if cfg.AccessKey == "" {
		cfg.AccessKey = "phalanx"
	}
	if cfg.SecretKey == "" {
		var b [12]byte
		rand.Read(b[:])
		cfg.SecretKey = hex.EncodeToString(b[:])
	}
	if cfg.ReadyWait == 0 {
		cfg.ReadyWait = DefaultReadyWait
	}
	return &Server{cfg: cfg, auto: auto, pick: loopbackPort}, nil
}

// loopbackPort is a free loopback host:port (free when returned; the
// server binds it a moment later).
func loopbackPort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("minioserver: a loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// probeWait bounds one health probe: a port held by another process may
// take the connection and never answer.
const probeWait = time.Second

// startAttempts bounds the first starts on endpoints New chose.
const startAttempts = 5

// Start is New then Server.Start.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Endpoint is the server's host:port: New's choice, or, if its first
// start found that port taken, the one it serves on (read it after
// Start).
func (s *Server) Endpoint() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Endpoint
}

// Dir is the server's data directory.
func (s *Server) Dir() string { return s.cfg.Dir }

// Credentials are the server's root access and secret keys.
func (s *Server) Credentials() (accessKey, secretKey string) {
	return s.cfg.AccessKey, s.cfg.SecretKey
}

// Pid is the running server process's id (0: not running).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Start runs a server process on the endpoint and data directory and
// waits until it answers healthy (within ctx and Config.ReadyWait); it
// returns its pid. A process that does not get there is killed.
func (s *Server) Start(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return 0, fmt.Errorf("minioserver: already running on %s (pid %d)", s.cfg.Endpoint, s.cmd.Process.Pid)
	}
	for attempt := 1; ; attempt++ {
		pid, err := s.startOnce(ctx)
		if err == nil {
			s.started = true
			return pid, nil
		}
		if !s.auto || s.started || !errors.Is(err, ErrExited) || attempt == startAttempts || ctx.Err() != nil {
			return 0, err
		}
		endpoint, perr := s.pick()
		if perr != nil {
			return 0, errors.Join(err, perr)
		}
		s.cfg.Endpoint = endpoint
	}
}

// startOnce runs a server process and waits until it answers healthy.
func (s *Server) startOnce(ctx context.Context) (int, error) {
	cmd := s.cfg.Command(context.Background(), s.cfg.Binary, "server", s.cfg.Dir, "--address", s.cfg.Endpoint, "--console-address", "127.0.0.1:0", "--quiet")
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+s.cfg.AccessKey, "MINIO_ROOT_PASSWORD="+s.cfg.SecretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "CI=")
	cmd.Stdout, cmd.Stderr = s.cfg.Output, s.cfg.Output
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("minioserver: starting %s: %w", s.cfg.Binary, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	pid := cmd.Process.Pid
	if err := s.waitReady(ctx, pid, exited); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		<-exited
		return 0, err
	}
	s.cmd, s.exited = cmd, exited
	return pid, nil
}

// waitReady polls the health endpoint until it answers 200, the process
// exits, or ctx (bounded by Config.ReadyWait) ends.
func (s *Server) waitReady(ctx context.Context, pid int, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadyWait)
	defer cancel()
	url := "http://" + s.cfg.Endpoint + healthPath
	client := http.DefaultClient
	if s.cfg.Dial != nil {
		client = &http.Client{Transport: &http.Transport{DialContext: s.cfg.Dial, DisableKeepAlives: true}}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited: // before a probe, which another process on the port may leave unanswered
			return fmt.Errorf("minioserver: %w (pid %d, on %s)", ErrExited, pid, s.cfg.Endpoint)
		default:
		}
		pctx, pcancel := context.WithTimeout(ctx, probeWait)
		req, err := http.NewRequestWithContext(pctx, http.MethodGet, url, nil)
		if err != nil {
			pcancel()
			return fmt.Errorf("minioserver: %w", err)
		}
		var last string
		resp, err := client.Do(req)
		pcancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			return fmt.Errorf("minioserver: %w (pid %d, on %s)", ErrExited, pid, s.cfg.Endpoint)
		case <-ctx.Done():
			return fmt.Errorf("minioserver: MinIO (pid %d) not healthy within %v: GET %s: last %s: %w",
				pid, s.cfg.ReadyWait, url, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// Kill SIGKILLs the running server and waits (within ctx) until it is
// gone; it returns its pid.
func (s *Server) Kill(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0, errors.New("minioserver: not running")
	}
	pid := s.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return 0, fmt.Errorf("minioserver: SIGKILL to MinIO (pid %d): %w", pid, err)
	}
	select {
	case <-s.exited:
	case <-ctx.Done():
		return 0, fmt.Errorf("minioserver: MinIO (pid %d) SIGKILLed, not yet gone: %w", pid, ctx.Err())
	}
	s.cmd = nil
	return pid, nil
}

// Signal sends sig to the running server (SIGSTOP, SIGCONT, ...); it
// returns its pid.
func (s *Server) Signal(sig syscall.Signal) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0, errors.New("minioserver: not running")
	}
	pid := s.cmd.Process.Pid
	if err := syscall.Kill(pid, sig); err != nil {
		return 0, fmt.Errorf("minioserver: signal %q to MinIO (pid %d): %w", sig, pid, err)
	}
	return pid, nil
}

// Stop kills the running server, paused or not, and waits until it is
// gone; it does nothing when none runs.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGCONT)
	syscall.Kill(pid, syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}
