package ring

import (
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
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
			r := newRingJob(&job.Env{Out: &out, Events: events.New(&evs, time.Now), LC: &job.LaunchConfig{}}, nil)
			if c.stop {
				r.stop = &job.Stopped{Step: 7}
			}
			for i, err := range c.exits {
				r.exited(launch.Exit{Role: "worker", Index: i, Pid: 100 + i, Err: err})
			}
			for _, id := range c.skips {
				r.checkpoint(0, job.Checkpoint{Checkpoint: checkpoint.Event{Kind: "skipped", ID: id, Err: "damaged"}})
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

// TestProgressLines: a job resumed at step 40 of 100 counts this run's
// steps: its ETA comes from this run's pace (a step a second here: 55 s
// left after step 45, not the whole job's average over 45 steps), its
// samples/s is what was trained since the previous line (four steps of
// 5 ms and one of 45 ms: 1,280 samples in 65 ms, not the last step's
// 5,689/s), and its end says 60 steps, 41 to 100. --log-every sets the
// lines' spacing.
func TestProgressLines(t *testing.T) {
	for _, c := range []struct {
		name     string
		every    int64
		lines    int
		want     []string
		doneWant string
	}{
		{"default: twenty lines", 0, 12, []string{
			"step  45/100  loss 0.5000  acc  90.0%     19692 samples/s  4 workers  ETA 55s\n",
			"step 100/100  loss 0.5000  acc  90.0%     19692 samples/s  4 workers  ETA 0s\n"},
			"done: 60 steps (41 to 100) in 1m0s; held-out loss 0.2500, accuracy 91.00%"},
		{"--log-every 30", 30, 3, []string{
			"step  60/100  loss 0.5000  acc  90.0%     19692 samples/s  4 workers  ETA 40s\n", "step  90/100"},
			"done: 60 steps (41 to 100) in 1m0s;"},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := time.Unix(1000, 0)
			var out strings.Builder
			lc := &job.LaunchConfig{Config: job.Config{Steps: 100, Now: func() time.Time { return clock }}, LogEvery: c.every}
			r := newRingJob(&job.Env{Out: &out, Events: events.New(io.Discard, nil), LC: lc}, nil)
			for step := int64(41); step <= 100; step++ {
				clock = clock.Add(time.Second)
				secs := 0.005
				if step%5 == 0 {
					secs = 0.045
				}
				r.progress(Step{Step: step, World: 4, Loss: 0.5, Accuracy: 0.9, SamplesPS: 256 / secs, StepS: secs})
			}
			if n := strings.Count(out.String(), "step "); n != c.lines {
				t.Errorf("%d progress lines, want %d:\n%s", n, c.lines, out.String())
			}
			for _, w := range c.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("progress lacks %q:\n%s", w, out.String())
				}
			}
			if got := r.doneLine(&Done{Step: 100, Loss: 0.25, Accuracy: 0.91}); !strings.HasPrefix(got, c.doneWant) {
				t.Errorf("done line %q, want it to begin %q", got, c.doneWant)
			}
		})
	}
}

// TestReportText: a worker watched by a person (phalanx worker without
// --json) speaks plain lines: its registration, its generation as rank 0,
// a progress line every 5 steps of 10 (samples/s over the steps since the
// previous line), a checkpoint, and its end. Nothing is JSON.
func TestReportText(t *testing.T) {
	var out strings.Builder
	say := job.ReportText(&out, 10, 5)
	say(job.Registered{ID: "w-1", Pid: 42})
	say(Restored{Generation: 1, World: 2, DataPlane: "shm"})
	for step := int64(1); step <= 10; step++ {
		secs := 0.01
		if step%5 == 0 {
			secs = 0.03
		}
		say(Step{Step: step, World: 2, Loss: 0.5, Accuracy: 0.75, SamplesPS: 256 / secs, StepS: secs})
	}
	say(job.Checkpoint{Step: 10, Checkpoint: checkpoint.Event{Kind: "saved", Step: 10, URL: "/c/step-10", Bytes: 2048, Seconds: 0.5}})
	say(Done{Step: 10, World: 2, Loss: 0.25, Accuracy: 0.9})
	want := `registered as w-1 (pid 42); waiting for a ring
generation 1: rank 0 of 2 workers, at step 0 (0 redone), over shm
step 5/10  loss 0.5000  acc  75.0%  2 workers  18286 samples/s
step 10/10  loss 0.5000  acc  75.0%  2 workers  18286 samples/s
checkpoint of step 10 saved: /c/step-10 (2.0 KiB in 0.50s)
done: step 10 on 2 workers; held-out loss 0.2500, accuracy 90.00%
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestOpenStoreSaysWhere: the launcher names the store it opens before
// opening it (an S3 endpoint with its default shown), and a location that
// does not parse is refused before anything is said or started.
func TestOpenStoreSaysWhere(t *testing.T) {
	dir := t.TempDir()
	var out strings.Builder
	c := job.DefaultConfig()
	c.Checkpoint.Location = dir
	if _, err := job.OpenStore(t.Context(), &c, &out); err != nil || out.String() != "checkpoints: "+dir+"\n" {
		t.Fatalf("job.OpenStore(%s): %v, said %q", dir, err, out.String())
	}
	out.Reset()
	c.Checkpoint.Location = "s3://bucket?endpoint=a:b:c"
	if _, err := job.OpenStore(t.Context(), &c, &out); err == nil || out.Len() != 0 {
		t.Fatalf("job.OpenStore(%s): %v, said %q; want a refusal and nothing said", c.Checkpoint.Location, err, out.String())
	}
	l, err := checkpoint.ParseLocation("s3://bucket/run1")
	if err != nil || l.String() != "s3://bucket/run1?endpoint=s3.amazonaws.com" || !l.S3.TLS {
		t.Fatalf("s3://bucket/run1 parses to %v (TLS %v), %v: want the default endpoint named, with TLS", l, l.S3 != nil && l.S3.TLS, err)
	}
}

// TestResumedAfterItsGeneration: a ring's resumption, reported by its rank
// 0 before the launcher has read its generation from etcd, is told after
// the generation's line, not before it.
func TestResumedAfterItsGeneration(t *testing.T) {
	var out strings.Builder
	r := newRingJob(&job.Env{Out: &out, Events: events.New(io.Discard, nil), LC: &job.LaunchConfig{}}, nil)
	gen := func(n uint64, ids ...string) *phalanxpb.Generation {
		g := &phalanxpb.Generation{Number: n, Reason: fmt.Sprintf("reason %d", n)}
		for _, id := range ids {
			g.Members = append(g.Members, &phalanxpb.Member{Id: id})
		}
		return g
	}
	restored := func(n uint64) launch.Line {
		b, _ := job.MarshalReport(Restored{Generation: n, World: 1, Step: 40, Redone: 2})
		return launch.Line{Index: 0, Text: b}
	}
	r.generation(gen(1, "a", "b"))
	if err := r.handle(restored(1)); err != nil {
		t.Fatal(err)
	}
	if err := r.handle(restored(2)); err != nil { // before generation 2 is read
		t.Fatal(err)
	}
	r.generation(gen(2, "a"))
	want := "generation 1: 2 workers (reason 1)\ngeneration 2: 1 workers (reason 2)\ngeneration 2: resumed at step 40 on 1 workers, 2 steps redone\n"
	if out.String() != want {
		t.Fatalf("the terminal said\n%s\nwant\n%s", out.String(), want)
	}
}
