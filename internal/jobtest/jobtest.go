// Package jobtest runs Phalanx jobs as real OS processes in tests: a
// launcher (the phalanx command, or a program embedding the runtime) whose
// event log the test reads as it is written, through a pipe given as
// --events /dev/fd/3, and helpers to wait for events, signal processes by
// PID and check what a job trained. It is for tests only.
package jobtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

// Event is one event of a job's log.
type Event = map[string]any

// Buffer is a bytes.Buffer safe for a child's stdout and stderr.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// EventsFlag is the flag pair a launcher must be given for Start to read
// its events.
var EventsFlag = []string{"--events", "/dev/fd/3"}

// DefaultDeadline bounds every wait of a Job (Until, End, Finish) and of a
// Process's wait when the environment does not say otherwise: generous, so
// that a loaded machine is never mistaken for a hang, yet short of go test's
// own timeout, so that a hang is reported as what was awaited rather than
// as a dump of every goroutine. PHALANX_TEST_WAIT (a time.Duration) changes
// it for a whole run.
const DefaultDeadline = 4 * time.Minute

// Deadline is PHALANX_TEST_WAIT, or DefaultDeadline: the bound of every
// wait of a Job or Process, and of a test's other waits for a whole job.
func Deadline() time.Duration { return deadline() }

// storeWait bounds the store calls of NewestComplete and CopyCheckpoint
// (MinIO on a loaded machine included): the error of a call cut short says
// which it was.
const storeWait = 2 * time.Minute

// deadline is PHALANX_TEST_WAIT, or DefaultDeadline.
func deadline() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("PHALANX_TEST_WAIT")); err == nil && d > 0 {
		return d
	}
	return DefaultDeadline
}

// Job is a launcher process whose events the test reads as they happen.
type Job struct {
	Cmd  *exec.Cmd
	Out  *Buffer // its stdout and stderr
	Seen []Event // the events read so far
	// Deadline bounds each wait (Until, End, Finish) from its start; Start
	// sets it to PHALANX_TEST_WAIT or DefaultDeadline.
	Deadline time.Duration
	events   chan Event
	exited   chan error
}

// Start starts cmd, which must write its events to /dev/fd/3 (EventsFlag),
// and kills it when the test ends; its output is logged if the test failed.
func Start(t testing.TB, cmd *exec.Cmd) *Job {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{w}
	j := &Job{Cmd: cmd, Out: &Buffer{}, Deadline: deadline(), events: make(chan Event, 1<<16), exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = j.Out, j.Out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		defer close(j.events)
		defer r.Close()
		Decode(r, func(e Event) { j.events <- e })
	}()
	go func() { j.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		for range j.events {
		}
		if t.Failed() {
			t.Logf("launcher output:\n%s", LastLines(j.Out.String(), 80))
		}
	})
	return j
}

// Decode reads JSON objects, one a line, from r until it ends (an event
// log, a worker's --json reports), and hands each to f in order; a line
// that is not one is handed as {"event": "garbage", "line": ...}.
func Decode(r io.Reader, f func(Event)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			e = Event{"event": "garbage", "line": sc.Text()}
		}
		f(e)
	}
}

// Until reads events until one satisfies pred, and returns it. It fails the
// test if the job ends first, or if none came within j.Deadline, naming
// what it waited for and the last events read.
func (j *Job) Until(t testing.TB, what string, pred func(Event) bool) Event {
	t.Helper()
	timer := time.NewTimer(j.Deadline)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-j.events:
			if !ok {
				t.Fatalf("the job ended before %s; last events:\n%s", what, j.lastEvents(10))
				return nil
			}
			j.Seen = append(j.Seen, e)
			if pred(e) {
				return e
			}
		case <-timer.C:
			t.Fatalf("waited %v for %s; last events:\n%s", j.Deadline, what, j.lastEvents(10))
			return nil
		}
	}
}

// lastEvents are the last n events seen, one a line.
func (j *Job) lastEvents(n int) string {
	var b strings.Builder
	for _, e := range j.Seen[max(0, len(j.Seen)-n):] {
		line, _ := json.Marshal(e)
		b.Write(line)
		b.WriteByte('\n')
	}
	if len(j.Seen) == 0 {
		b.WriteString("(none)\n")
	}
	return b.String()
}

// DeadlineError is End's error when the launcher neither exited nor closed
// its event log within Job.Deadline; End kills it then.
type DeadlineError struct {
	Waited time.Duration
	Last   string // the last events seen, one a line
}

func (e *DeadlineError) Error() string {
	return fmt.Sprintf("waited %v for the job to end; killed it; last events:\n%s", e.Waited, e.Last)
}

// End reads the remaining events and waits for the launcher's exit; it
// returns every event by kind and the exit error: a *DeadlineError if that
// took longer than j.Deadline (the launcher is killed then).
func (j *Job) End() (map[string][]Event, error) {
	timer := time.NewTimer(j.Deadline)
	defer timer.Stop()
	var err error
	timedOut := false
	for e := range j.eventsUntil(timer.C, &timedOut) {
		j.Seen = append(j.Seen, e)
	}
	if timedOut {
		j.Cmd.Process.Kill()
		<-j.exited
		err = &DeadlineError{Waited: j.Deadline, Last: j.lastEvents(10)}
	} else {
		select {
		case err = <-j.exited:
		case <-timer.C:
			j.Cmd.Process.Kill()
			<-j.exited
			err = &DeadlineError{Waited: j.Deadline, Last: j.lastEvents(10)}
		}
	}
	j.exited <- err // for a second call
	by := map[string][]Event{}
	for _, e := range j.Seen {
		k, _ := e["event"].(string)
		by[k] = append(by[k], e)
	}
	return by, err
}

// eventsUntil yields j's events until the log closes or stop fires (then
// *timedOut is set).
func (j *Job) eventsUntil(stop <-chan time.Time, timedOut *bool) func(func(Event) bool) {
	return func(yield func(Event) bool) {
		for {
			select {
			case e, ok := <-j.events:
				if !ok || !yield(e) {
					return
				}
			case <-stop:
				*timedOut = true
				return
			}
		}
	}
}

// Finish is End for a job that must succeed.
func (j *Job) Finish(t testing.TB) map[string][]Event {
	t.Helper()
	by, err := j.End()
	if err != nil {
		t.Fatalf("the job failed: %v", err)
	}
	return by
}

// WorkerPids are the pids of the launcher's workers (a ring's or a
// pipeline's) seen so far, by launch index.
func (j *Job) WorkerPids() map[int]int {
	out := map[int]int{}
	for _, e := range j.Seen {
		if e["event"] == "worker_started" && (e["role"] == nil || e["role"] == "worker" || e["role"] == "pipeline-worker") {
			out[Num(e, "worker")] = Num(e, "pid")
		}
	}
	return out
}

// Kill sends sig to the process pid, failing the test when pid is not a
// process's own (0 or below would signal a whole process group, the
// test's among them) or the signal cannot be sent.
func Kill(t testing.TB, pid int, sig syscall.Signal) {
	t.Helper()
	if pid <= 1 {
		t.Fatalf("no process to send %v to (pid %d)", sig, pid)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("sending %v to pid %d: %v", sig, pid, err)
	}
}

// KillWorker sends sig to the launcher's worker k, failing the test when
// no worker k was seen started.
func (j *Job) KillWorker(t testing.TB, k int, sig syscall.Signal) int {
	t.Helper()
	pid, ok := j.WorkerPids()[k]
	if !ok {
		t.Fatalf("no worker %d seen started: %v", k, j.WorkerPids())
	}
	Kill(t, pid, sig)
	return pid
}

// Started is the job_started event seen, or nil.
func (j *Job) Started() Event {
	for _, e := range j.Seen {
		if e["event"] == "job_started" {
			return e
		}
	}
	return nil
}

// StepIn: a step from the given one on, trained by a ring of world
// workers.
func StepIn(world, step int) func(Event) bool {
	return func(e Event) bool {
		return e["event"] == "step" && e["world"].(float64) == float64(world) && e["step"].(float64) >= float64(step)
	}
}

// WorldIs: a generation of n workers.
func WorldIs(n int) func(Event) bool {
	return func(e Event) bool { return e["event"] == "generation" && e["world"].(float64) == float64(n) }
}

// Kind: an event of kind k.
func Kind(k string) func(Event) bool { return func(e Event) bool { return e["event"] == k } }

// Num is field k of e as an integer.
func Num(e Event, k string) int { return int(e[k].(float64)) }

// LastLines is the last n lines of s.
func LastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Process starts cmd as a helper process (a worker added by hand, a
// coordinator, an etcd member), killed when the test ends; its output is
// logged if the test failed. A cmd whose Stdout is set keeps it (a pipe
// its caller reads), and out holds its stderr alone. wait returns its exit
// error, or, if it has not exited within PHALANX_TEST_WAIT or
// DefaultDeadline, kills it and returns an error saying so.
func Process(t testing.TB, name string, cmd *exec.Cmd) (out *Buffer, wait func() error) {
	t.Helper()
	out = &Buffer{}
	if cmd.Stdout == nil {
		cmd.Stdout = out
	}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var werr error
	go func() { werr = cmd.Wait(); close(exited) }()
	limit := deadline()
	wait = func() error {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		select {
		case <-exited:
			return werr
		case <-timer.C:
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("waited %v for %s to exit; killed it (%v)", limit, name, werr)
		}
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s output:\n%s", name, LastLines(out.String(), 60))
		}
	})
	return out, wait
}

// Freeze stops processes (SIGSTOP) until Thaw, or the test's end.
func Freeze(t testing.TB, pids ...int) {
	t.Helper()
	t.Cleanup(func() { Thaw(pids...) })
	for _, p := range pids {
		Kill(t, p, syscall.SIGSTOP)
	}
}

// Thaw resumes frozen processes (SIGCONT).
func Thaw(pids ...int) {
	for _, p := range pids {
		if p > 1 {
			syscall.Kill(p, syscall.SIGCONT)
		}
	}
}

// CheckSamples proves that a job trained every step once, in order, on
// exactly the sampler's global batch: no sample of an epoch lost or
// repeated, across every generation and resume. steps are its step events,
// first to last.
func CheckSamples(t testing.TB, steps []Event, total, samples, batch int, seed uint64) {
	t.Helper()
	s, err := worker.NewSampler(samples, seed)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != total {
		seen := map[int]Event{}
		for _, e := range steps {
			if prev, ok := seen[Num(e, "step")]; ok {
				t.Fatalf("%d step events, want %d: step %d reported twice: %v and %v", len(steps), total, Num(e, "step"), prev, e)
			}
			seen[Num(e, "step")] = e
		}
		t.Fatalf("%d step events, want %d", len(steps), total)
	}
	var pos worker.Position
	for i, e := range steps {
		if Num(e, "step") != i+1 {
			t.Fatalf("step event %d is of step %d", i+1, Num(e, "step"))
		}
		idx, _, next, err := s.Batch(pos, batch, 1, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := worker.FingerprintOf(idx)
		var got worker.Fingerprint
		for k, v := range e["fingerprint"].([]any) {
			got[k] = v.(float64)
		}
		if got != want {
			t.Fatalf("step %d (generation %v, world %v) trained on samples with fingerprint %v; the sampler's global batch has %v",
				i+1, e["generation"], e["world"], got, want)
		}
		if int64(Num(e, "epoch")) != next.Epoch || int64(Num(e, "offset")) != next.Offset {
			t.Fatalf("step %d ended at %v/%v, want %+v", i+1, e["epoch"], e["offset"], next)
		}
		pos = next
	}
}

// CheckHybridSamples is CheckSamples for a hybrid-mode job, whose steps may
// close without some ranks: every step was trained once, in order, and
// every sample of the sampler's global batch was either trained in it or
// recorded as dropped (the step's stale ranks' shards). A step's
// fingerprint must be that of the shards of exactly its participants ranks
// of its world, participants + stale = world. It returns the number of
// samples dropped, and the ranks left out of each step that left any out
// (by step): whose shards the fingerprint proves missing.
func CheckHybridSamples(t testing.TB, steps []Event, total, samples, batch int, seed uint64) (dropped int, left map[int][]int) {
	t.Helper()
	s, err := worker.NewSampler(samples, seed)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != total {
		t.Fatalf("%d step events, want %d", len(steps), total)
	}
	var pos worker.Position
	for i, e := range steps {
		if Num(e, "step") != i+1 {
			t.Fatalf("step event %d is of step %d", i+1, Num(e, "step"))
		}
		world, parts, stale := Num(e, "world"), Num(e, "participants"), Num(e, "stale")
		if parts+stale != world || parts < 1 {
			t.Fatalf("step %d: %d participants and %d stale in a world of %d", i+1, parts, stale, world)
		}
		shards := make([]worker.Fingerprint, world)
		var next worker.Position
		for r := range world {
			idx, _, n, err := s.Batch(pos, batch, world, r, nil)
			if err != nil {
				t.Fatal(err)
			}
			shards[r], next = worker.FingerprintOf(idx), n
		}
		var got worker.Fingerprint
		for k, v := range e["fingerprint"].([]any) {
			got[k] = v.(float64)
		}
		found := false
		if left == nil {
			left = map[int][]int{}
		}
		for set := 0; set < 1<<world && !found; set++ {
			var sum worker.Fingerprint
			n, lost := 0, 0.0
			for r := range world {
				if set&(1<<r) == 0 {
					lost += shards[r][0]
					continue
				}
				n++
				for k := range sum {
					sum[k] += shards[r][k]
				}
			}
			if n == parts && sum == got {
				found = true
				dropped += int(lost)
				for r := range world {
					if set&(1<<r) == 0 {
						left[i+1] = append(left[i+1], r)
					}
				}
			}
		}
		if !found {
			t.Fatalf("step %d (generation %v, world %v, %d participants) trained on samples with fingerprint %v: not the shards of %d of its ranks (global batch: %v)",
				i+1, e["generation"], world, parts, got, parts, shards)
		}
		if int64(Num(e, "epoch")) != next.Epoch || int64(Num(e, "offset")) != next.Offset {
			t.Fatalf("step %d ended at %v/%v, want %+v", i+1, e["epoch"], e["offset"], next)
		}
		pos = next
	}
	return dropped, left
}

// NewestComplete is the manifest of the newest complete checkpoint in s.
func NewestComplete(t testing.TB, s checkpoint.Store) *phalanxpb.Manifest {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()
	infos, err := checkpoint.List(ctx, s)
	if err != nil {
		t.Fatalf("listing the checkpoints: %v", err)
	}
	for _, in := range infos { // newest first
		if in.Complete {
			m, err := checkpoint.ReadManifest(ctx, s, in.ID)
			if err != nil {
				t.Fatalf("reading checkpoint %s's manifest: %v", in.ID, err)
			}
			return m
		}
	}
	t.Fatal("no complete checkpoint")
	return nil
}

// TensorSums are the checksums of every tensor segment of a checkpoint:
// equal sums of two checkpoints of one world are bitwise equal states.
func TensorSums(m *phalanxpb.Manifest) []uint32 {
	var out []uint32
	for _, tn := range m.Tensors {
		for _, s := range tn.Segments {
			out = append(out, s.Crc32C)
		}
	}
	return out
}

// CopyCheckpoint copies checkpoint id from one store to another, its
// manifest last.
func CopyCheckpoint(t testing.TB, from, to checkpoint.Store, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), storeWait)
	defer cancel()
	objs, err := from.List(ctx, id+"/")
	if err != nil {
		t.Fatalf("listing checkpoint %s's objects: %v", id, err)
	}
	last := func(o checkpoint.ObjectInfo) int {
		if strings.HasSuffix(o.Name, checkpoint.ManifestName) {
			return 1
		}
		return 0
	}
	slices.SortFunc(objs, func(a, b checkpoint.ObjectInfo) int { return last(a) - last(b) })
	for _, o := range objs {
		buf := make([]byte, o.Size)
		if err := from.ReadAt(ctx, o.Name, buf, 0); err != nil {
			t.Fatalf("copying checkpoint %s: reading %s: %v", id, o.Name, err)
		}
		if err := to.Put(ctx, o.Name, buf); err != nil {
			t.Fatalf("copying checkpoint %s: writing %s: %v", id, o.Name, err)
		}
	}
}

// KeptDir is a directory for t's runs that outlives a failed test: it is
// removed when t passes, and named in t's log when t fails, so the logs
// and checkpoints a failure message points at are still there to read
// (t.TempDir removes them with the test). CHAOS_KEEP_DIR, when set, is
// used instead and never removed.
func KeptDir(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("CHAOS_KEEP_DIR"); dir != "" {
		return dir
	}
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	dir, err := os.MkdirTemp("", "phalanx-"+name+"-")
	if err != nil {
		t.Fatalf("a directory for the test's runs: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the failed runs' logs and checkpoints are kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}
