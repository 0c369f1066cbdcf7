package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/minioserver"
)

// ErrNoMinIO: a scenario's job.store is "minio" and there is no MinIO
// server binary (the error wraps minioserver.ErrNoBinary too, which says
// how to install one).
var ErrNoMinIO = errors.New("chaos: job.store minio needs the MinIO server binary")

// minioBucket is the bucket a run's checkpoints go to, under minioPrefix.
const (
	minioBucket = "phalanx-chaos"
	minioPrefix = "checkpoints"
)

// minioService is the MinIO server a scenario with job.store "minio" keeps
// its checkpoints in (nil: none).
func minioService(sc *Scenario) (Service, error) {
	if sc.Job.Store != "minio" {
		return nil, nil
	}
	bin, err := minioBinary()
	if err != nil {
		return nil, fmt.Errorf("scenario %q: %w", sc.Name, err)
	}
	return &minioServer{bin: bin}, nil
}

// minioBinary finds the MinIO server as internal/minioserver does.
func minioBinary() (string, error) {
	bin, err := minioserver.Binary()
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoMinIO, err)
	}
	return bin, nil
}

// minioServer is a real MinIO server process (internal/minioserver) on a
// loopback port chosen at run time, its data in the run's directory.
// Faults stop, kill, pause and restart it on the same port and data.
type minioServer struct {
	bin string

	mu       sync.Mutex
	log      *zap.Logger
	srv      *minioserver.Server
	endpoint string // 127.0.0.1:port
	logFile  *os.File
	creds    checkpoint.Credentials
	pids     []int // every server process started
	closed   bool
}

func (s *minioServer) Name() string { return "minio" }

// Start starts MinIO with its data in dir/minio and creates the bucket.
func (s *minioServer) Start(ctx context.Context, dir string, log *zap.Logger) error {
	s.log = log
	f, err := os.Create(filepath.Join(dir, "minio.log"))
	if err != nil {
		return fmt.Errorf("chaos: minio: %w", err)
	}
	s.logFile = f
	srv, err := minioserver.New(minioserver.Config{Binary: s.bin, Dir: filepath.Join(dir, "minio"),
		AccessKey: "phalanx-chaos", Output: f})
	if err != nil {
		return fmt.Errorf("chaos: minio: %w", err)
	}
	s.srv = srv
	s.creds.AccessKey, s.creds.SecretKey = srv.Credentials()
	if _, err := s.start(ctx); err != nil {
		return err
	}
	s.endpoint = srv.Endpoint() // where it serves: its first start may have moved off a port taken meanwhile
	url, creds := s.CheckpointLocation()
	if _, err := checkpoint.OpenURL(ctx, url, creds); err != nil { // creates the bucket
		return fmt.Errorf("chaos: minio: creating the bucket: %w", err)
	}
	return nil
}

// start runs a server process on the endpoint and data, and waits until it
// answers ready; it returns its pid.
func (s *minioServer) start(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errors.New("chaos: minio: closed")
	}
	pid, err := s.srv.Start(ctx)
	if err != nil {
		return 0, fmt.Errorf("chaos: %w (its log: minio.log in the run's directory)", err)
	}
	s.pids = append(s.pids, pid)
	s.log.Info("chaos: MinIO ready", zap.String("endpoint", s.srv.Endpoint()), zap.Int("pid", pid))
	return pid, nil
}

// kill SIGKILLs the running server and waits for it; it returns its pid.
func (s *minioServer) kill(ctx context.Context) (int, error) {
	pid, err := s.srv.Kill(ctx)
	if err != nil {
		return 0, fmt.Errorf("chaos: %w", err)
	}
	return pid, nil
}

// signal sends sig to the running server; it returns its pid.
func (s *minioServer) signal(sig syscall.Signal) (int, error) {
	pid, err := s.srv.Signal(sig)
	if err != nil {
		return 0, fmt.Errorf("chaos: %s: %w", signalName(sig), err)
	}
	return pid, nil
}

// CheckpointLocation is the bucket's URL on this server and its
// credentials.
func (s *minioServer) CheckpointLocation() (string, checkpoint.Credentials) {
	return "s3://" + minioBucket + "/" + minioPrefix + "?endpoint=" + s.endpoint, s.creds
}

// Configure gives the launch MinIO's credentials, which reach the workers
// in their environment (never on a command line).
func (s *minioServer) Configure(lc *phalanx.LaunchConfig) { lc.Credentials = s.creds }

// Close stops MinIO for good (the runner checks the store first).
func (s *minioServer) Close() error {
	s.stop()
	return nil
}

// stop kills the server for good, paused or not, and closes its log.
func (s *minioServer) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.srv != nil {
		s.srv.Stop()
	}
	if s.logFile != nil {
		s.logFile.Close()
		s.logFile = nil
	}
}

// Leftovers names any MinIO process still alive after Close, or its
// port still answering.
func (s *minioServer) Leftovers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, pid := range s.pids {
		if err := syscall.Kill(pid, 0); err == nil || !errors.Is(err, syscall.ESRCH) {
			out = append(out, fmt.Sprintf("MinIO server process %d still exists", pid))
		}
	}
	if s.endpoint != "" {
		if c, err := net.DialTimeout("tcp", s.endpoint, time.Second); err == nil {
			c.Close()
			out = append(out, "MinIO's port "+s.endpoint+" still accepts connections")
		}
	}
	return out
}

// minioKinds are the faults on MinIO.
func minioKinds() []Kind {
	return []Kind{
		{Name: "minio-stop", Doc: "SIGKILL the MinIO server mid-upload and hold its port shut (every connection reset) for the fault's duration " +
			"and until a worker's request has been refused, then start it again on the same port and data: uploads are retried or reported failed, " +
			"never complete when incomplete, and training goes on", Needs: "minio", NeedsCheckpoints: true, Changes: "none",
			New: func(p Planned) Fault { return &minioFault{dur: time.Duration(p.Duration)} }},
		{Name: "minio-pause", Doc: "SIGSTOP the MinIO server for the fault's duration and until a worker's request waits on it (sent after the stop: trigger it before a checkpoint step), " +
			"then SIGCONT: uploads hang and complete late, training goes on", Needs: "minio", NeedsCheckpoints: true, Changes: "none",
			New: func(p Planned) Fault { return &minioFault{dur: time.Duration(p.Duration), pause: true} }},
	}
}

// minioJob is the MinIO scenarios' job: the small job on whole rings (a
// store outage must not change the model: compared bitwise), a checkpoint
// every 10 steps into MinIO.
func minioJob() JobSpec {
	j := wholeRing(smallJob(3, 10))
	j.Store = "minio"
	return j
}

// minioScenarios are the built-in scenarios of MinIO faults. The stop
// comes right after a checkpoint step (its upload, or its manifest, is
// likely in flight; if not, the next checkpoint's is: the outage lasts
// until a worker's request is refused). The pause comes before one: a
// request the server had read whole before SIGSTOP would wait unseen (its
// bytes no longer queued on the socket), one sent after is seen.
func minioScenarios() []Scenario {
	return []Scenario{
		{Name: "minio-restart", Description: "MinIO SIGKILLed right after a checkpoint step, its port refusing connections for 1s and until a worker's upload is refused, " +
			"then restarted on the same port and data: the uploads are retried, training goes on bitwise, every complete checkpoint verifies",
			Job: minioJob(), CI: true,
			Faults: []FaultSpec{{Kind: "minio-stop", Trigger: Trigger{Step: 11}, Duration: Duration(time.Second)}}},
		{Name: "minio-pause", Description: "MinIO SIGSTOPped a few steps before a checkpoint, for 1s and until a worker's upload waits on it, then SIGCONT: " +
			"the uploads complete late, training goes on bitwise, every complete checkpoint verifies",
			Job: minioJob(), CI: true,
			Faults: []FaultSpec{{Kind: "minio-pause", Trigger: Trigger{Step: 4}, Duration: Duration(time.Second)}}},
	}
}
