package phalanx_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/failure"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// hangEvents keeps a job's hang analyses, its workers' pids and its steps.
type hangEvents struct {
	mu    sync.Mutex
	lines []string
	ranks []int
	pids  map[int]int
	step  int64
	dumps int
	log   events.Sink
	found chan struct{}
}

func (h *hangEvents) Emit(event string, fields ...events.Field) error {
	get := func(k string) any { return fieldOf(fields, k) }
	h.mu.Lock()
	switch event {
	case "hang_analysis":
		h.lines = append(h.lines, get("line").(string))
		h.ranks = append(h.ranks, get("rank").(int))
		select {
		case h.found <- struct{}{}:
		default:
		}
	case "collective_dump":
		h.dumps++
	case "worker_started":
		h.pids[get("worker").(int)] = get("pid").(int)
	case "step":
		h.step = get("step").(int64)
	}
	h.mu.Unlock()
	return h.log.Emit(event, fields...)
}

// TestHangRecorder: when a collective operation hangs or fails, the
// survivors dump their last operations and the launcher's analysis names
// the rank at fault in one line: a rank made to call a barrier where the
// others enter an allreduce, and a rank stopped with SIGSTOP, which never
// enters the operation the others time out in. The saved event log gives
// the same line (phalanx debug hang).
func TestHangRecorder(t *testing.T) {
	t.Run("another operation", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "events.jsonl")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		h := &hangEvents{pids: map[int]int{}, log: events.New(f, nil), found: make(chan struct{}, 1)}
		lc := smallJob()
		lc.Workers, lc.Steps, lc.Events = 3, 120, h
		lc.Faults.Inject.WrongOp = []failure.WrongOp{{Rank: 1, At: 30}}
		res, err := phalanx.Launch(launchContext(t), lc)
		if err != nil {
			t.Fatal(err)
		}
		if res.Step != 120 {
			t.Errorf("the job ended at step %d, want 120: the ring is rebuilt after the calls that did not match", res.Step)
		}
		h.mu.Lock()
		lines, ranks := h.lines, h.ranks
		h.mu.Unlock()
		const want = "rank 1 entered barrier #"
		if len(lines) != 1 || ranks[0] != 1 || !strings.HasPrefix(lines[0], want) || !strings.Contains(lines[0], "where the others entered allreduce") {
			t.Fatalf("hang analyses %q (ranks %v); want one, naming rank 1: %q...", lines, ranks, want)
		}
		saved, err := phalanx.AnalyzeHangs(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(saved) != 1 || saved[0].Line != lines[0] {
			t.Errorf("the saved events' analysis: %+v, want the launcher's line %q", saved, lines[0])
		}
	})
	t.Run("stopped", func(t *testing.T) {
		h := &hangEvents{pids: map[int]int{}, log: (*events.Log)(nil), found: make(chan struct{}, 1)}
		lc := smallJob()
		lc.Workers, lc.Steps, lc.Events = 3, 1000000, h
		lc.OpTimeout, lc.LeaseTTL = 3*time.Second, 30*time.Second // the operation times out before the lease expires
		startRunning(t, lc)
		h.mu.Lock()
		pid := h.pids[2]
		h.mu.Unlock()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer syscall.Kill(pid, syscall.SIGKILL) // before the job's stop (startRunning's cleanup)
		testwait.Recv(t, h.found, 2*time.Minute, "the hang analysis after worker 2's SIGSTOP")
		h.mu.Lock()
		line, rank, dumps := h.lines[0], h.ranks[0], h.dumps
		h.mu.Unlock()
		if rank != 2 || !strings.HasPrefix(line, "rank 2 never entered allreduce #") || !strings.Contains(line, "last seen in") {
			t.Fatalf("the analysis says %q (rank %d), want rank 2, stopped, never entering the allreduce, and where it was last seen", line, rank)
		}
		if dumps != 2 {
			t.Errorf("%d dumps, want the two survivors'", dumps)
		}
	})
}
