package phalanx

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
)

// exitErr is a real child's exit with status code.
func exitErr(t *testing.T, code string) error {
	t.Helper()
	err := exec.Command("sh", "-c", "exit "+code).Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("sh exit %s: %v", code, err)
	}
	return err
}

// TestTerminalNoise: the launcher's terminal says each thing once. A worker
// of a stopping job exits 4 as it should, which is not news (the event
// still records it); a worker's other ends are. A checkpoint that several
// ranks found damaged is named once, though each rank's event is kept.
func TestTerminalNoise(t *testing.T) {
	stopped, failed := exitErr(t, "4"), exitErr(t, "1")
	cases := []struct {
		name  string
		stop  bool
		exits []error
		skips []string
		want  []string // each line, with how many times it must appear
		count []int
	}{
		{"a requested stop: workers' exit 4 unsaid", true, []error{stopped, stopped, stopped}, nil,
			[]string{"exit status 4"}, []int{0}},
		{"a stop with a failing worker: its failure said", true, []error{stopped, failed}, nil,
			[]string{"worker 0 (pid 100) ended: exit status 4", "worker 1 (pid 101) ended: exit status 1"}, []int{0, 1}},
		{"no stop: exit 4 is news", false, []error{stopped}, nil,
			[]string{"worker 0 (pid 100) ended: exit status 4"}, []int{1}},
		{"a damaged checkpoint found by three ranks, another by one", false, nil, []string{"step-1", "step-1", "step-2", "step-1"},
			[]string{"checkpoint step-1 skipped: damaged", "checkpoint step-2 skipped: damaged"}, []int{1, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, evs strings.Builder
			r := &ringJob{jobEnv: &jobEnv{out: &out, ev: events.New(&evs, time.Now)}}
			if c.stop {
				r.stop = &Report{Kind: "stopped", Step: 7}
			}
			for i, err := range c.exits {
				r.exited(launch.Exit{Role: "worker", Index: i, Pid: 100 + i, Err: err})
			}
			for _, id := range c.skips {
				r.checkpointEvent(&checkpoint.Event{Kind: "skipped", ID: id, Err: "damaged"})
			}
			for i, line := range c.want {
				if n := strings.Count(out.String(), line); n != c.count[i] {
					t.Errorf("%q said %d times, want %d; the terminal:\n%s", line, n, c.count[i], out.String())
				}
			}
			if n, want := strings.Count(evs.String(), `"worker_exited"`)+strings.Count(evs.String(), `"checkpoint_skipped"`), len(c.exits)+len(c.skips); n != want {
				t.Errorf("%d events, want %d (every exit and every rank's skip recorded):\n%s", n, want, evs.String())
			}
		})
	}
}
