package phalanx_test

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/sockowner"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// started records what a job started: its name, etcd endpoints and
// processes.
type started struct {
	mu        sync.Mutex
	job       string
	endpoints []string
	pids      []int
}

func (s *started) Emit(event string, fields ...events.Field) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range fields {
		switch {
		case event == "job_started" && f.Key == "job":
			s.job = f.Value.(string)
		case event == "job_started" && f.Key == "etcd_endpoints":
			s.endpoints = strings.Split(f.Value.(string), ",")
		case event == "worker_started" && f.Key == "pid":
			s.pids = append(s.pids, f.Value.(int))
		}
	}
	return nil
}

// leftovers are what the job left behind: a process still alive, an etcd
// port still open, a shared-memory file of its data plane.
func (s *started) leftovers(t *testing.T) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var left []string
	if s.job == "" || len(s.pids) == 0 || len(s.endpoints) == 0 {
		t.Fatalf("the job's events named no job, process or etcd endpoint: %+v", s)
	}
	for _, pid := range s.pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			left = append(left, "process "+strconv.Itoa(pid))
		}
	}
	for _, ep := range s.endpoints {
		addr := strings.TrimPrefix(ep, "http://")
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			// The embedded etcd ran in this process: a port held by
			// another is one the kernel handed out again since.
			if pid, err := sockowner.Listener(addr); err == nil && pid != 0 && pid != os.Getpid() && !slices.Contains(s.pids, pid) {
				continue
			}
			left = append(left, "etcd port "+ep)
		}
	}
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		t.Fatalf("listing /dev/shm: %v", err)
	}
	for _, e := range ents {
		if collective.ShmSegmentOf(e.Name(), s.job) {
			left = append(left, "/dev/shm/"+e.Name())
		}
	}
	return left
}

// TestStart: a job's handle. Ready closes once the first ring trains,
// Wait returns the result; Stop stops a job with checkpoints after a final
// one; cancelling the context leaves no process, port or shared-memory
// file behind.
func TestStart(t *testing.T) {
	t.Run("wait", func(t *testing.T) {
		j, err := phalanx.Start(launchContext(t), smallJob())
		if err != nil {
			t.Fatal(err)
		}
		testwait.Recv(t, j.Ready(), 2*time.Minute, "the job's first step")
		res, err := j.Wait()
		if err != nil || res == nil || res.Step != 150 || !res.ParametersIdentical {
			t.Fatalf("Wait: %+v, %v; want 150 steps, identical parameters", res, err)
		}
	})
	t.Run("stop after a final checkpoint", func(t *testing.T) {
		lc := smallJob()
		lc.Steps, lc.Checkpoint.Location = 100000, t.TempDir()
		j, err := phalanx.Start(launchContext(t), lc)
		if err != nil {
			t.Fatal(err)
		}
		testwait.Recv(t, j.Ready(), 2*time.Minute, "the job's first step")
		if err := j.Stop(testwait.Context(t, 2*time.Minute)); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		res, err := j.Wait()
		var se *phalanx.StoppedError
		if !errors.As(err, &se) || !se.Requested || se.Checkpoint == "" || res != nil {
			t.Fatalf("Wait after Stop: %+v, %v; want a requested stop after a final checkpoint, no result", res, err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		lc := smallJob()
		lc.Steps, lc.Transport = 100000, "shm"
		s := &started{}
		lc.Events = s
		ctx, cancel := context.WithCancel(launchContext(t))
		j, err := phalanx.Start(ctx, lc)
		if err != nil {
			t.Fatal(err)
		}
		testwait.Recv(t, j.Ready(), 2*time.Minute, "the job's first step")
		cancel()
		testwait.Recv(t, j.Done(), 2*time.Minute, "the job's end after its context was cancelled")
		if res, err := j.Wait(); err == nil || res != nil {
			t.Fatalf("Wait after cancelling: %+v, %v; want an error and no result", res, err)
		}
		if left := s.leftovers(t); len(left) > 0 {
			t.Fatalf("the cancelled job left %v behind", left)
		}
	})
	t.Run("refused", func(t *testing.T) {
		lc := smallJob()
		lc.Workers = 0
		var ce *phalanx.ConfigError
		if j, err := phalanx.Start(launchContext(t), lc); !errors.As(err, &ce) || j != nil {
			t.Fatalf("Start: %v, %v; want a ConfigError and no job", j, err)
		}
	})
}
