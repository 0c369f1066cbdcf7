package ring

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

// event is one event a sink received, its fields by key.
type event struct {
	kind   string
	fields map[string]any
}

// eventRecorder is an events.Sink that keeps what it is told.
type eventRecorder struct {
	mu  sync.Mutex
	evs []event
}

func (e *eventRecorder) Emit(kind string, fields ...events.Field) error {
	m := map[string]any{}
	for _, f := range fields {
		m[f.Key] = f.Value
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, event{kind, m})
	return nil
}

func (e *eventRecorder) all() []event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.evs)
}

// launcherRig is a ring job's launcher with no processes: what it prints,
// the events it emits, a clock the test moves, and how often it ended the
// job's context.
type launcherRig struct {
	r       *ringJob
	out     bytes.Buffer
	ev      eventRecorder
	clock   time.Time
	cancels int
}

func newLauncherRig(steps, every int64) *launcherRig {
	g := &launcherRig{clock: time.Unix(1000, 0)}
	lc := &job.LaunchConfig{Config: job.Config{Steps: steps, Now: func() time.Time { return g.clock }}, LogEvery: every}
	g.r = newRingJob(&job.Env{LC: lc, Out: &g.out, Events: &g.ev, Procs: launch.NewGroup()}, nil)
	g.r.cancel = func() { g.cancels++ }
	return g
}

// step is what a launcher is fed, in order.
type step func(g *launcherRig) error

// line feeds a report line as worker index printed it (the report's JSON
// text: the wire, not the Go type).
func line(index int, text string) step {
	return func(g *launcherRig) error {
		return g.r.handle(launch.Line{Role: "worker", Index: index, Text: []byte(text)})
	}
}

// gen feeds a generation read from etcd: members by id, lost ids after a
// "-" (e.g. gen(2, "a", "-", "b")).
func gen(n uint64, ids ...string) step {
	return func(g *launcherRig) error {
		gn := &phalanxpb.Generation{Number: n, Reason: fmt.Sprintf("reason %d", n)}
		lost := false
		for i, id := range ids {
			switch {
			case id == "-":
				lost = true
			case lost:
				gn.Lost = append(gn.Lost, &phalanxpb.LostMember{Id: id, Rank: int32(i), DetectedBy: "lease expired"})
			default:
				gn.Members = append(gn.Members, &phalanxpb.Member{Id: id, Pid: int64(100 + i)})
			}
		}
		g.r.generation(gn)
		return nil
	}
}

func stoppedGen(n uint64, reason string) step {
	return func(g *launcherRig) error {
		g.r.generation(&phalanxpb.Generation{Number: n, Stopped: true, Reason: reason})
		return nil
	}
}

func exit(index int, err error) step {
	return func(g *launcherRig) error {
		g.r.exited(launch.Exit{Role: "worker", Index: index, Pid: 100 + index, Err: err})
		return nil
	}
}

func tick(d time.Duration) step {
	return func(g *launcherRig) error {
		g.clock = g.clock.Add(d)
		return nil
	}
}

// atEnd is what the job's end does first: every resumption still held is
// told.
func atEnd(g *launcherRig) error {
	g.r.resumed(math.MaxUint64)
	return nil
}

// ev is an event's kind and the fields checked (printed with %v).
type ev struct {
	kind   string
	fields map[string]any
}

func checkEvents(t *testing.T, got []event, want []ev) {
	t.Helper()
	var kinds []string
	for _, e := range got {
		kinds = append(kinds, e.kind)
	}
	if len(got) != len(want) {
		t.Fatalf("events %q, want %d of them: %v", kinds, len(want), want)
	}
	for i, w := range want {
		if got[i].kind != w.kind {
			t.Errorf("event %d is %s, want %s (events %q)", i, got[i].kind, w.kind, kinds)
			continue
		}
		for k, v := range w.fields {
			gv, ok := got[i].fields[k]
			if !ok || fmt.Sprint(gv) != fmt.Sprint(v) {
				t.Errorf("event %d (%s): %s = %v, want %v (fields %v)", i, w.kind, k, gv, v, got[i].fields)
			}
		}
	}
}

type f = map[string]any

// TestLauncherStateMachine drives the launcher's side of a ring job, with
// no process, by what it is fed: report lines as workers print them,
// generations as read from etcd, process exits. It checks the events, the
// terminal's lines in order, and the job's state (its failure, done and
// stop, and whether it ended the job's context).
func TestLauncherStateMachine(t *testing.T) {
	tests := []struct {
		name         string
		steps, every int64
		feed         []step
		wantErr      string // the feed's first error must contain it
		events       []ev
		out          string
		check        func(t *testing.T, g *launcherRig)
	}{
		{
			name: "steps: an event each, a stale ring's and a replayed one dropped, a progress line every 2", steps: 4, every: 2,
			feed: []step{
				line(0, `{"kind":"step","step":1,"generation":2,"world":2,"loss":0.9,"accuracy":0.5,"samples_per_s":100,"step_s":1}`),
				tick(time.Second),
				line(0, `{"kind":"step","step":2,"generation":2,"world":2,"loss":0.8,"accuracy":0.6,"samples_per_s":300,"step_s":1,"participants":1,"stale":1}`),
				line(1, `{"kind":"step","step":3,"generation":1,"world":3,"loss":0.7}`), // rank 0 of a ring that steps no more
				line(0, `{"kind":"step","step":2,"generation":3,"world":2,"replayed":true,"trained_in":2}`),
				tick(time.Second),
				line(0, `{"kind":"step","step":3,"generation":3,"world":1,"loss":0.7,"accuracy":0.7,"samples_per_s":100,"step_s":1}`),
				tick(time.Second),
				line(0, `{"kind":"step","step":4,"generation":3,"world":1,"loss":0.6,"accuracy":0.8,"samples_per_s":100,"step_s":1}`),
			},
			events: []ev{
				{"step", f{"step": 1, "generation": 2, "world": 2, "participants": 2, "stale": 0}},
				{"step", f{"step": 2, "generation": 2, "world": 2, "participants": 1, "stale": 1}},
				{"step", f{"step": 3, "generation": 3, "world": 1}},
				{"step", f{"step": 4, "generation": 3, "world": 1}},
			},
			out: "step 2/4  loss 0.8000  acc  60.0%       200 samples/s  2 workers  ETA 2s\n" +
				"step 4/4  loss 0.6000  acc  80.0%       100 samples/s  1 workers  ETA 0s\n",
		},
		{
			name: "a resumption reported before its generation is read: its event at once, its line after that generation's",
			feed: []step{
				gen(1, "a", "b"),
				line(0, `{"kind":"restored","generation":1,"world":2,"step":0,"data_plane":"shm"}`), // the first ring: not a resumption
				line(0, `{"kind":"restored","generation":2,"world":1,"step":40,"steps_redone":2,"root":0,"data_plane":"tcp"}`),
				gen(2, "a", "-", "b"),
			},
			events: []ev{
				{"generation", f{"generation": 1, "world": 2}},
				{"data_plane", f{"generation": 1, "world": 2, "plane": "shm"}},
				{"data_plane", f{"generation": 2, "world": 1, "plane": "tcp"}},
				{"restored", f{"generation": 2, "world": 1, "step": 40, "steps_redone": 2, "root": 0}},
				{"generation", f{"generation": 2, "world": 1, "reason": "reason 2"}},
				{"worker_lost", f{"generation": 2, "id": "b", "detected_by": "lease expired"}},
			},
			out: "generation 1: 2 workers (reason 1)\n" +
				"generation 2: 1 workers (reason 2)\n" +
				"generation 2: resumed at step 40 on 1 workers, 2 steps redone\n",
			check: func(t *testing.T, g *launcherRig) {
				if len(g.r.pending) != 0 {
					t.Errorf("%d resumptions still held after their generation was read", len(g.r.pending))
				}
			},
		},
		{
			name: "a ring's resumption, steps and end reported before its generation is read: their events at once, in order (the resumption's before the steps'), the resumption's line after the generation's",
			feed: []step{
				gen(1, "a", "b"),
				line(0, `{"kind":"step","step":80,"generation":1,"world":2}`),
				line(0, `{"kind":"restored","generation":2,"world":1,"step":80,"steps_redone":0}`),
				line(0, `{"kind":"step","step":81,"generation":2,"world":1}`),
				line(0, `{"kind":"done","step":81,"generation":2,"world":1}`),
				gen(2, "a", "-", "b"),
			},
			events: []ev{
				{"generation", f{"generation": 1}},
				{"step", f{"step": 80, "generation": 1}},
				{"data_plane", f{"generation": 2}},
				{"restored", f{"generation": 2, "step": 80}},
				{"step", f{"step": 81, "generation": 2}},
				{"done", f{"step": 81, "generation": 2}},
				{"generation", f{"generation": 2}},
				{"worker_lost", f{"generation": 2, "id": "b"}},
			},
			out: "generation 1: 2 workers (reason 1)\n" +
				"step  80/100  loss 0.0000  acc   0.0%         - samples/s  2 workers  ETA -\n" +
				"generation 2: 1 workers (reason 2)\ngeneration 2: resumed at step 80 on 1 workers, 0 steps redone\n",
			check: func(t *testing.T, g *launcherRig) {
				if len(g.r.pending) != 0 || g.r.done == nil {
					t.Errorf("%d resumptions still held after their generation was read; done %+v", len(g.r.pending), g.r.done)
				}
			},
		},
		{
			name: "a resumption whose generation is never read is told at the job's end",
			feed: []step{
				gen(1, "a", "b"),
				line(0, `{"kind":"restored","generation":3,"world":2,"step":12,"steps_redone":1}`),
				gen(2, "a"),
				atEnd,
			},
			events: []ev{
				{"generation", f{"generation": 1}},
				{"data_plane", f{"generation": 3}},
				{"restored", f{"generation": 3, "step": 12, "steps_redone": 1}},
				{"generation", f{"generation": 2}},
			},
			out: "generation 1: 2 workers (reason 1)\ngeneration 2: 1 workers (reason 2)\ngeneration 3: resumed at step 12 on 2 workers, 1 steps redone\n",
		},
		{
			name: "the first worker's own failure is the job's: it ends the job at once; later failures and a done are not the job's",
			feed: []step{
				line(1, `{"kind":"failed","reason":"rank actor gave up: out of memory"}`),
				line(0, `{"kind":"failed","reason":"ring broken"}`),
				line(0, `{"kind":"done","step":10,"generation":1,"world":2,"identical":true}`),
			},
			events: []ev{
				{"worker_failed", f{"worker": 1, "reason": "rank actor gave up: out of memory"}},
				{"worker_failed", f{"worker": 0, "reason": "ring broken"}},
			},
			check: func(t *testing.T, g *launcherRig) {
				if g.r.failed == nil || g.r.failed.Error() != "worker 1 failed: rank actor gave up: out of memory" {
					t.Errorf("the job's failure is %v, want worker 1's", g.r.failed)
				}
				if g.cancels != 1 || g.r.killAt != nil {
					t.Errorf("the job's context ended %d times (killAt %v), want once at the first failure, no grace", g.cancels, g.r.killAt)
				}
				if g.r.done != nil {
					t.Errorf("a failed job is done: %+v", g.r.done)
				}
			},
		},
		{
			name: "a non-finite failure lets the others end on their own, until killAt",
			feed: []step{
				line(2, `{"kind":"failed","reason":"step 7 not finite","non_finite":{"step":7,"param":"w","index":1}}`),
				line(0, `{"kind":"failed","reason":"step 7 not finite","non_finite":{"step":7}}`),
			},
			events: []ev{
				{"worker_failed", f{"worker": 2, "non_finite": &worker.NonFiniteError{Step: 7, Param: "w", Index: 1}}},
				{"worker_failed", f{"worker": 0}},
			},
			check: func(t *testing.T, g *launcherRig) {
				var nf *worker.NonFiniteError
				if !errors.As(g.r.failed, &nf) || nf.Step != 7 || nf.Param != "w" || !strings.HasPrefix(g.r.failed.Error(), "worker 2 failed: ") {
					t.Errorf("the job's failure is %v, want worker 2's non-finite step 7 (wrapped)", g.r.failed)
				}
				if g.r.killAt == nil || g.cancels != 0 {
					t.Errorf("killAt %v, the job's context ended %d times: want a grace before the kill, and no end yet", g.r.killAt, g.cancels)
				}
			},
		},
		{
			name: "done is taken once; a failure after it is not the job's",
			feed: []step{
				line(0, `{"kind":"done","step":10,"generation":2,"world":2,"loss":0.25,"accuracy":0.9,"identical":true,"params_crc32c":7,"rank_crc32c":[7,7]}`),
				line(0, `{"kind":"done","step":11,"generation":3,"world":1}`),
				line(1, `{"kind":"failed","reason":"late"}`),
			},
			events: []ev{
				{"done", f{"step": 10, "generation": 2, "world": 2, "parameters_identical": true, "parameters_crc32c": 7, "parameters_crc32c_by_rank": []uint32{7, 7}}},
				{"worker_failed", f{"worker": 1, "reason": "late"}},
			},
			check: func(t *testing.T, g *launcherRig) {
				if g.r.done == nil || g.r.done.Step != 10 || g.r.failed != nil || g.cancels != 0 {
					t.Errorf("done %+v, failed %v, context ended %d times: want the first done, no failure", g.r.done, g.r.failed, g.cancels)
				}
			},
		},
		{
			name: "a done without identical is not parameters_identical",
			feed: []step{line(0, `{"kind":"done","step":10,"generation":2,"world":2}`)},
			events: []ev{
				{"done", f{"step": 10, "parameters_identical": false}},
			},
		},
		{
			name: "the first stop report is kept; a stopped generation says why",
			feed: []step{
				line(0, `{"kind":"stopped","step":5,"generation":2,"world":2}`),
				line(0, `{"kind":"stopped","step":6,"generation":2,"world":2}`),
				stoppedGen(3, "below MinWorkers for 1m0s"),
			},
			events: []ev{
				{"stopped", f{"step": 5, "generation": 2, "world": 2}},
				{"generation", f{"generation": 3, "world": 0, "reason": "below MinWorkers for 1m0s"}},
			},
			out: "generation 3: job stopped: below MinWorkers for 1m0s\n",
			check: func(t *testing.T, g *launcherRig) {
				if g.r.stop == nil || g.r.stop.Step != 5 || g.r.stopped != "below MinWorkers for 1m0s" {
					t.Errorf("stop %+v, stopped %q", g.r.stop, g.r.stopped)
				}
			},
		},
		{
			name: "registered: a pid is known as its worker",
			feed: []step{line(3, `{"kind":"registered","id":"w-3","pid":4242}`)},
			check: func(t *testing.T, g *launcherRig) {
				if i, ok := g.r.byPid[4242]; !ok || i != 3 {
					t.Errorf("pid 4242 is worker %d (%v), want 3", i, ok)
				}
			},
		},
		{
			name: "a restart, a checkpoint, an overlap fallback, a feed and a departure",
			feed: []step{
				line(1, `{"kind":"restart","rank":1,"step":8,"reason":"panic: fault injected at step 9","restarts":1}`),
				line(0, `{"kind":"checkpoint","step":8,"checkpoint":{"kind":"saved","id":"step-8","url":"/c/step-8","step":8,"bytes":2048,"seconds":0.5,"world_after":2}}`),
				line(0, `{"kind":"overlap_fallback","step":9,"late":[2],"deadline_s":0.1}`),
				line(0, `{"kind":"fed","id":"w-2","step":10}`),
				line(2, `{"kind":"left","id":"w-2","pid":4243}`),
				line(0, `{"kind":"training","generation":2,"world":2,"rank":0}`), // no event of its own
			},
			events: []ev{
				{"rank_restarted", f{"rank": 1, "committed_step": 8, "restarts": 1}},
				{"checkpoint_saved", f{"step": 8, "checkpoint": "step-8", "bytes": 2048, "world": 2}},
				{"hybrid_overlap_fallback", f{"step": 9, "late": []int{2}, "deadline_s": 0.1}},
				{"straggler_fed", f{"id": "w-2", "step": 10}},
			},
			out: "rank 1 restarted by its supervisor (panic: fault injected at step 9); resumed from the commit of step 8\n" +
				"checkpoint of step 8 saved: /c/step-8 (2.0 KiB in 0.50s)\n" +
				"worker 2 (pid 4243) left the job on request\n",
		},
		{
			name:    "garbage on stdout is an error naming the process",
			feed:    []step{line(2, `hello from a stray fmt.Println`)},
			wantErr: `phalanx: worker 2 printed "hello from a stray fmt.Println", not a report`,
		},
		{
			name: "exits: each an event; a failure's said, a clean one's and those after done are not",
			feed: []step{
				exit(0, nil),
				exit(1, errors.New("exit status 1")),
				line(0, `{"kind":"done","step":10,"generation":1,"world":1}`),
				exit(2, errors.New("signal: killed")),
			},
			events: []ev{
				{"worker_exited", f{"worker": 0, "pid": 100, "status": "exit 0"}},
				{"worker_exited", f{"worker": 1, "pid": 101, "status": "exit status 1"}},
				{"done", f{"step": 10}},
				{"worker_exited", f{"worker": 2, "pid": 102, "status": "signal: killed"}},
			},
			out: "worker 1 (pid 101) ended: exit status 1\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newLauncherRig(cmp.Or(tc.steps, 100), tc.every)
			var err error
			for _, s := range tc.feed {
				if err = s(g); err != nil {
					break
				}
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("fed: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("fed: %v; want an error containing %q", err, tc.wantErr)
			}
			checkEvents(t, g.ev.all(), tc.events)
			if g.out.String() != tc.out {
				t.Errorf("the terminal said\n%s\nwant\n%s", g.out.String(), tc.out)
			}
			if tc.check != nil {
				tc.check(t, g)
			}
		})
	}
}

// TestLauncherEndFailed: ending a failed job ends its context (its
// coordinator) and signals its workers; with none left, lines drain to
// nothing.
func TestLauncherEndFailed(t *testing.T) {
	g := newLauncherRig(10, 0)
	g.r.endFailed()
	if g.cancels != 1 {
		t.Fatalf("endFailed ended the job's context %d times, want once", g.cancels)
	}
	if err := g.r.drainLines(); err != nil {
		t.Fatalf("draining no lines: %v", err)
	}
}

// TestLauncherExit: a worker's exit, judged once its last lines are read:
// its own failure (an exit status but 4, not a signal) ends the job and is
// its failure, unless the job failed or was done before; a stopped
// worker's exit 4 and a killed one's are not failures.
func TestLauncherExit(t *testing.T) {
	status := func(code int) error { return exitErr(t, fmt.Sprint(code)) }
	killed := exec.Command("sh", "-c", "kill -KILL $$").Run() // a real child's death by SIGKILL
	if !launch.Signalled(killed) {
		t.Fatalf("sh killing itself: %v, want a death by signal", killed)
	}
	if got := killed.Error() + ", " + status(4).Error(); got != "signal: killed, exit status 4" {
		t.Fatalf("made exits say %q", got)
	}
	tests := []struct {
		name    string
		before  []step
		exit    error
		failure string // "": the job did not fail
	}{
		{"a clean exit", nil, nil, ""},
		{"its own failure", nil, status(1), "worker 1 (pid 101) failed: exit status 1"},
		{"stopped (exit 4)", nil, status(job.ExitStopped), ""},
		{"killed", nil, killed, ""},
		{"after the job was done", []step{line(0, `{"kind":"done","step":10}`)}, status(1), ""},
		{"after another's failure, which stays the job's", []step{line(0, `{"kind":"failed","reason":"first"}`)}, status(1), "worker 0 failed: first"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newLauncherRig(10, 0)
			for _, s := range tc.before {
				if err := s(g); err != nil {
					t.Fatal(err)
				}
			}
			cancels := g.cancels
			if err := g.r.exit(launch.Exit{Role: "worker", Index: 1, Pid: 101, Err: tc.exit}); err != nil {
				t.Fatal(err)
			}
			got := ""
			if g.r.failed != nil {
				got = g.r.failed.Error()
			}
			if got != tc.failure {
				t.Errorf("the job's failure is %q, want %q", got, tc.failure)
			}
			ownFailure := tc.failure != "" && tc.before == nil
			if ended := g.cancels > cancels; ended != ownFailure {
				t.Errorf("the exit ended the job: %v, want %v", ended, ownFailure)
			}
			if evs := g.ev.all(); len(evs) == 0 || evs[len(evs)-1].kind != "worker_exited" {
				t.Errorf("events %v: want the exit's last", evs)
			}
		})
	}
}

// TestLauncherEnd: once every worker exited, the job's end: its failure;
// a requested stop whose final checkpoint is not in the store (here: no
// store) is an error saying so; a stop by the coordinator is a
// *job.StoppedError with its reason; no done is an error; a done is the
// job's result, said in a done line after any resumption still held.
func TestLauncherEnd(t *testing.T) {
	tests := []struct {
		name    string
		feed    []step
		wantErr string
		check   func(t *testing.T, err error)
		want    *job.Result
		out     string
	}{
		{name: "failed", feed: []step{line(1, `{"kind":"failed","reason":"boom"}`), line(0, `{"kind":"done","step":10}`)},
			wantErr: "worker 1 failed: boom"},
		{name: "stopped on request, no final checkpoint", feed: []step{line(0, `{"kind":"stopped","step":5,"generation":1,"world":2}`)},
			wantErr: "phalanx: stopped at step 5 without a final checkpoint: the job has no checkpoint store",
			out:     "stopped at step 5 WITHOUT a final checkpoint: the job has no checkpoint store\n"},
		{name: "stopped by the coordinator", feed: []step{stoppedGen(2, "below MinWorkers")}, wantErr: "below MinWorkers",
			check: func(t *testing.T, err error) {
				var s *job.StoppedError
				if !errors.As(err, &s) || s.Reason != "below MinWorkers" {
					t.Errorf("%v: want a *job.StoppedError of the coordinator's reason", err)
				}
			},
			out: "generation 2: job stopped: below MinWorkers\n"},
		{name: "none done", wantErr: "phalanx: every worker ended and none reported the job done"},
		{name: "done", feed: []step{
			gen(1, "a", "b"),
			line(0, `{"kind":"restored","generation":2,"world":2,"step":3,"steps_redone":1}`),
			tick(90 * time.Second),
			line(0, `{"kind":"done","step":10,"generation":2,"world":2,"loss":0.25,"accuracy":0.9,"identical":true,"params_crc32c":7,"rank_crc32c":[7,7]}`),
		},
			want: &job.Result{Step: 10, Generation: 2, World: 2, Loss: 0.25, Accuracy: 0.9, ParametersIdentical: true, ParametersCRC: 7, RankCRCs: []uint32{7, 7}},
			out: "generation 1: 2 workers (reason 1)\ngeneration 2: resumed at step 3 on 2 workers, 1 steps redone\n" +
				"done: 10 steps in 1m30s; held-out loss 0.2500, accuracy 90.00%\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := newLauncherRig(10, 1000)
			for _, s := range tc.feed {
				if err := s(g); err != nil {
					t.Fatal(err)
				}
			}
			res, err := g.r.end(testwait.Context(t, time.Minute))
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("end: %+v, %v; want an error containing %q", res, err, tc.wantErr)
			case tc.wantErr == "" && (err != nil || !reflect.DeepEqual(res, tc.want)):
				t.Fatalf("end: %+v, %v; want %+v", res, err, tc.want)
			}
			if tc.check != nil {
				tc.check(t, err)
			}
			if g.out.String() != tc.out {
				t.Errorf("the terminal said\n%s\nwant\n%s", g.out.String(), tc.out)
			}
		})
	}
}
