package phalanx_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"encoding/json"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/trace"
)

// TestTraceTimeline: a job launched with a trace file ends with one
// Chrome trace merged from its processes: it parses, every span is closed
// and no two overlap on a thread of a process; each rank is a process
// whose every step has its forward/backward, wait for the reduction and
// optimizer spans, and no wait for a decision (a bulk-synchronous step has
// none to wait for); each rank's checkpoint snapshots and
// uploads are there, and the manifests; and an
// allreduce's spans on the two ranks intersect once the clocks are
// aligned. A trace file that exists is refused before anything starts,
// and left as it was.
func TestTraceTimeline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.trace.json")
	lc := smallJob()
	lc.Steps, lc.Trace = 60, path
	lc.Checkpoint.Location, lc.Checkpoint.EverySteps = t.TempDir(), 20
	if _, err := phalanx.Launch(launchContext(t), lc); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := trace.CheckFile(b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".parts"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the processes' parts are still there after the merge: %v", err)
	}
	var f trace.File
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	names := map[int]string{}
	count := map[int]map[string]int{}
	// An operation is its group's thread, generation and number: a job's
	// first ring may have been of one worker, whose operations are
	// numbered from 1 as the next ring's are.
	type opKey struct {
		thread   string
		gen, seq float64
	}
	ops := map[opKey][]trace.Event{}
	threads := map[[2]int]string{} // by process and thread id: the thread's name
	for _, e := range f.TraceEvents {
		if e.Ph == "M" && e.Name == "thread_name" {
			threads[[2]int{e.Pid, e.Tid}] = e.Args["name"].(string)
		}
	}
	for _, e := range f.TraceEvents {
		if e.Ph == "M" && e.Name == "process_name" {
			names[e.Pid] = e.Args["name"].(string)
		}
		if e.Ph != "X" {
			continue
		}
		if count[e.Pid] == nil {
			count[e.Pid] = map[string]int{}
		}
		count[e.Pid][e.Name]++
		if e.Name == "allreduce" {
			k := opKey{threads[[2]int{e.Pid, e.Tid}], e.Args["generation"].(float64), e.Args["seq"].(float64)}
			ops[k] = append(ops[k], e)
		}
	}
	if names[0] != "worker-0 (rank 0)" || names[1] != "worker-1 (rank 1)" {
		t.Errorf("processes named %v, want worker-0 (rank 0) and worker-1 (rank 1)", names)
	}
	for pid := range 2 {
		for _, span := range []string{"forward/backward", "wait for the reduction", "optimizer"} {
			if got := count[pid][span]; got != 60 {
				t.Errorf("process %d has %d %q spans, want one a step, 60", pid, got, span)
			}
		}
		for span, n := range count[pid] {
			if strings.Contains(span, "decision") || strings.Contains(span, "hybrid") {
				t.Errorf("process %d has %d %q spans in a bulk-synchronous job", pid, n, span)
			}
		}
	}
	for pid := range 2 {
		if got := count[pid]["checkpoint snapshot"]; got != 3 { // steps 20, 40 and 60
			t.Errorf("process %d has %d checkpoint snapshots, want 3", pid, got)
		}
	}
	// A state this small falls to fewer ranks than there are: each
	// checkpoint is uploaded at least once, and its manifest written.
	for _, span := range []string{"checkpoint upload", "checkpoint manifest"} {
		if got := count[0][span] + count[1][span]; got < 3 {
			t.Errorf("%d %q spans, want at least one a checkpoint, 3: %v", got, span, count)
		}
	}
	shared := 0
	for seq, es := range ops {
		if len(es) != 2 {
			continue
		}
		shared++
		// Both ends of a span are whole microseconds of the wall clock,
		// rounded down: the order of two instants is kept, so two ops
		// that met for less than a microsecond still intersect.
		a, b := es[0], es[1]
		if a.TS > b.TS+b.Dur || b.TS > a.TS+a.Dur {
			t.Errorf("allreduce %v: the ranks' spans [%v,+%v] and [%v,+%v] do not intersect", seq, a.TS, a.Dur, b.TS, b.Dur)
		}
	}
	if shared < 60 {
		t.Errorf("%d allreduces seen on both ranks, want at least one a step", shared)
	}

	// The same file again: refused, and kept.
	_, err = phalanx.Launch(launchContext(t), lc)
	var ce *phalanx.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Trace" {
		t.Fatalf("a second launch onto the same trace: %v, want a ConfigError on Trace", err)
	}
	if again, _ := os.ReadFile(path); string(again) != string(b) {
		t.Error("the refused launch changed the trace file")
	}
}
