package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/launch"
)

// pipeArgs is a small deep-mlp job: 4 hidden layers of 64 on a 64-feature
// teacher task, 2048 samples, a global batch of 64.
func pipeArgs(steps int, more ...string) []string {
	return append([]string{"--example", "deep-mlp", "--depth", "4", "--width", "64", "--features", "64", "--samples", "2048",
		"--steps", fmt.Sprint(steps), "--batch", "64", "--seed", "5", "--threads", "1", "--lr", "0.05"}, more...)
}

// doneOf is the job's done event.
func doneOf(t *testing.T, ev map[string][]jobtest.Event) jobtest.Event {
	t.Helper()
	d := ev["done"]
	if len(d) != 1 {
		t.Fatalf("%d done events, want 1", len(d))
	}
	return d[0]
}

// TestPipelineTrains: --pp 2 on every schedule trains to its last step
// with a pipeline_step event per stage and step, a progress line with each
// stage's busy fraction, and a held-out accuracy far above chance; and the
// same job on one stage (--pp 1) ends with bitwise the same model, as the
// stages add up each parameter's gradients over the micro-batches in the
// same order (wherever the cuts are: balanced by parameters, by measured
// time, or named).
func TestPipelineTrains(t *testing.T) {
	const steps = 60
	crcs := map[string]float64{}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"pp1", []string{"--pp", "1", "--micro-batches", "4"}},
		{"1f1b", []string{"--pp", "2", "--micro-batches", "4", "--pp-schedule", "1f1b"}},
		{"gpipe", []string{"--pp", "2", "--micro-batches", "4", "--pp-schedule", "gpipe"}},
		{"zb-h1", []string{"--pp", "2", "--micro-batches", "4", "--pp-schedule", "zb-h1"}},
		{"interleaved", []string{"--pp", "2", "--micro-batches", "4", "--pp-schedule", "interleaved"}},
		{"1f1b-recompute", []string{"--pp", "2", "--micro-batches", "4", "--pp-recompute"}},
		{"balanced-by-time", []string{"--pp", "2", "--micro-batches", "4", "--pp-balance", "time"}},
		{"cuts-by-name", []string{"--pp", "2", "--micro-batches", "4", "--pp-cuts", "fc1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := startJob(t, pipeArgs(steps, c.args...)...)
			ev := j.Finish(t)
			d := doneOf(t, ev)
			if jobtest.Num(d, "step") != steps {
				t.Errorf("done at step %v, want %d", d["step"], steps)
			}
			if acc := d["accuracy"].(float64); acc < 0.5 {
				t.Errorf("held-out accuracy %.3f, want above 0.5 (10 classes)", acc)
			}
			stages := 2
			if c.name == "pp1" {
				stages = 1
			}
			seen := map[[2]int]bool{}
			for _, e := range ev["pipeline_step"] {
				seen[[2]int{jobtest.Num(e, "step"), jobtest.Num(e, "stage")}] = true
			}
			for s := 1; s <= steps; s++ {
				for st := range stages {
					if !seen[[2]int{s, st}] {
						t.Fatalf("no pipeline_step event for step %d stage %d", s, st)
					}
				}
			}
			if !strings.Contains(j.Out.String(), "stage busy") {
				t.Errorf("no progress line with the stages' busy fractions:\n%s", jobtest.LastLines(j.Out.String(), 20))
			}
			crcs[c.name] = d["parameters_crc32c"].(float64)
		})
	}
	for name, crc := range crcs {
		if crc != crcs["pp1"] {
			t.Errorf("%s ended with model %08x, one stage with %08x", name, uint32(crc), uint32(crcs["pp1"]))
		}
	}
}

// TestPipelineDPxPP: --dp 2 --pp 2 runs four processes whose replicas end
// identical, with the same model as --dp 2 alone.
func TestPipelineDPxPP(t *testing.T) {
	const steps = 30
	var crc [2]float64
	for i, pp := range []string{"2", "1"} {
		j := startJob(t, pipeArgs(steps, "--dp", "2", "--pp", pp, "--micro-batches", "2")...)
		ev := j.Finish(t)
		d := doneOf(t, ev)
		if d["parameters_identical"] != true {
			t.Errorf("--pp %s: the replicas ended different", pp)
		}
		if n := len(ev["worker_started"]); n != 2*int(pp[0]-'0') {
			t.Errorf("--pp %s: %d workers started", pp, n)
		}
		crc[i] = d["parameters_crc32c"].(float64)
	}
	if crc[0] != crc[1] {
		t.Errorf("--dp 2 --pp 2 ended with model %08x, --dp 2 alone with %08x", uint32(crc[0]), uint32(crc[1]))
	}
}

// TestPipelineBadInput: each mistake is refused before anything starts,
// with an error naming it.
func TestPipelineBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pp", "2", "--pp-cuts", "3,5"}, "--pp-cuts"},
		{[]string{"--pp", "2", "--pp-cuts", "99"}, "past the model's last layer"},
		{[]string{"--pp", "2", "--pp-cuts", "fc99"}, "fc99"},
		{[]string{"--pp", "2", "--micro-batches", "5"}, "--micro-batches 5: does not divide a replica's batch of 64"},
		{[]string{"--pp", "2", "--dp", "2", "--workers", "3"}, "needs 4 workers"},
		{[]string{"--pp", "2", "--sync", "hybrid"}, "hybrid"},
		{[]string{"--pp", "2", "--pp-schedule", "pipedream"}, "--pp-schedule"},
		{[]string{"--pp", "20"}, "stages"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			out, err := command(t, append([]string{"train"}, pipeArgs(5, c.args...)...)...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), c.want) {
				t.Errorf("err %v, output %q; want an error saying %q", err, out, c.want)
			}
		})
	}
}

// TestPipelineStageKilled: SIGKILL one stage process of replica 1 of
// --dp 2 --pp 2 mid-job. Replica 1 drops out (stage_lost, replica_dropped),
// replica 0 goes on at the next step with no step redone, and the dead
// replica's surviving stage waits as a spare until the launcher's
// replacement (a fifth worker) joins (when the coordinator sees the loss
// and the join together, at once); the two re-form replica 1 from replica
// 0's parameters (replica_formed), and the job ends on two replicas,
// identical.
func TestPipelineStageKilled(t *testing.T) {
	// Long enough (a step takes about a millisecond) that the job still
	// runs when the fifth worker, started after the kill, joins.
	const steps = 8000
	j := startJob(t, pipeArgs(steps, "--dp", "2", "--pp", "2", "--micro-batches", "2")...)
	j.Until(t, "step 20", func(e jobtest.Event) bool { return e["event"] == "pipeline_step" && jobtest.Num(e, "step") >= 20 })
	j.KillWorker(t, 3, syscall.SIGKILL) // replica 1, stage 1
	lost := j.Until(t, "stage_lost", jobtest.Kind("stage_lost"))
	if jobtest.Num(lost, "replica") != 1 || jobtest.Num(lost, "stage") != 1 {
		t.Errorf("stage_lost %v, want replica 1 stage 1", lost)
	}
	j.Until(t, "replica_dropped", func(e jobtest.Event) bool { return e["event"] == "replica_dropped" && jobtest.Num(e, "replica") == 1 })
	formed := j.Until(t, "replica_formed", jobtest.Kind("replica_formed"))
	if jobtest.Num(formed, "replica") != 1 || jobtest.Num(formed, "donor") != 0 {
		t.Errorf("replica_formed %v, want replica 1 from replica 0", formed)
	}
	ev := j.Finish(t)
	if n := len(ev["worker_started"]); n != 5 {
		t.Errorf("%d workers started, want 4 and the replacement", n)
	}
	d := doneOf(t, ev)
	if jobtest.Num(d, "step") != steps || jobtest.Num(d, "replicas") != 2 || d["parameters_identical"] != true {
		t.Errorf("done %v, want step %d on 2 identical replicas", d, steps)
	}
	last := map[int]int{}
	for _, e := range ev["pipeline_step"] {
		st, s := jobtest.Num(e, "stage"), jobtest.Num(e, "step")
		if s <= last[st] {
			t.Fatalf("stage %d stepped %d after %d: a step redone", st, s, last[st])
		}
		last[st] = s
	}
}

// TestPipelineCheckpointReshape: a checkpoint written by --pp 4 resumes
// into --pp 2 (each new stage reads its tensors by name from the old
// stages' parts) at the same step and sampler position, and the resumed
// job ends with bitwise the model of the same job run through on --pp 2.
// One written by --dp 2 resumes into --dp 1; and with its newest
// checkpoint's part corrupted by one byte, the resume skips that one
// (checkpoint_skipped) and takes the one before.
func TestPipelineCheckpointReshape(t *testing.T) {
	args := func(steps int, more ...string) []string {
		return pipeArgs(steps, append([]string{"--schedule", "constant", "--micro-batches", "4"}, more...)...)
	}
	ref := doneOf(t, startJob(t, args(60, "--pp", "2")...).Finish(t))

	dir := t.TempDir()
	first := startJob(t, args(40, "--pp", "4", "--checkpoint", dir, "--checkpoint-every-steps", "20")...).Finish(t)
	if n := len(first["checkpoint_saved"]); n < 2 {
		t.Fatalf("%d checkpoint_saved events, want one at step 20 and the final one", n)
	}
	ev := startJob(t, args(60, "--pp", "2", "--checkpoint", dir)...).Finish(t)
	if r := ev["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != 40 {
		t.Fatalf("checkpoint_restored %v, want one at step 40", r)
	}
	if s := ev["pipeline_step"]; len(s) == 0 || jobtest.Num(s[0], "step") != 41 {
		t.Errorf("the resumed job's first step event %v, want step 41", s[:min(len(s), 1)])
	}
	if d := doneOf(t, ev); d["parameters_crc32c"] != ref["parameters_crc32c"] {
		t.Errorf("resumed from --pp 4 into --pp 2: model %v, run through on --pp 2: %v", d["parameters_crc32c"], ref["parameters_crc32c"])
	}

	dir2 := t.TempDir()
	startJob(t, args(40, "--dp", "2", "--pp", "2", "--checkpoint", dir2, "--checkpoint-every-steps", "20")...).Finish(t)
	corruptNewestPart(t, dir2)
	ev = startJob(t, args(60, "--dp", "1", "--pp", "2", "--checkpoint", dir2)...).Finish(t)
	if len(ev["checkpoint_skipped"]) == 0 {
		t.Errorf("no checkpoint_skipped event for the corrupted checkpoint")
	}
	if r := ev["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != 20 {
		t.Fatalf("checkpoint_restored %v, want one at step 20 (the step-40 one is corrupt)", r)
	}
	if d := doneOf(t, ev); jobtest.Num(d, "step") != 60 || d["accuracy"].(float64) < 0.5 {
		t.Errorf("done %v, want step 60 and accuracy above 0.5", d)
	}
}

// corruptNewestPart flips one byte of a stage's part of the newest
// pipeline checkpoint under dir.
func corruptNewestPart(t *testing.T, dir string) {
	t.Helper()
	parts, err := filepath.Glob(filepath.Join(dir, "pipeline", "p2-s1", "step-*", "shard-*"))
	if err != nil || len(parts) == 0 {
		t.Fatalf("no stage parts under %s: %v", dir, err)
	}
	slices.Sort(parts)
	p := parts[len(parts)-1]
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPipelineStageKilledAlone: --pp 2 with one replica. Each stage
// commits its state every --commit-every steps and copies it to the next
// stage. SIGKILL stage 1: the survivor waits (no replica forms alone); the
// launcher's replacement process joins, takes stage 1 from the copy in stage 0's
// memory, stage 0 rolls back to its own commit of that step
// (stage_restored, source peer; at most --commit-every steps redone), and
// the job finishes. SIGKILL both: the copies are gone with them, and the
// two replacements restore from the newest checkpoint (source checkpoint):
// of a checkpoint step, and no older than the newest one saved (indexed)
// that the launcher had reported by then. (Not a number of periods back:
// how many saves complete between the first and the kill depends on the
// machine's load.)
func TestPipelineStageKilledAlone(t *testing.T) {
	// The job cannot finish without its stages: the length only has to
	// outlast the wait for the first checkpoints and the kill.
	const steps, every, commit = 1000, 10, 4
	for _, c := range []struct {
		name   string
		kill   []int
		source string
		redone int
	}{
		{"one", []int{1}, "peer", commit},
		{"both", []int{0, 1}, "checkpoint", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			j := startJob(t, pipeArgs(steps, "--pp", "2", "--micro-batches", "2", "--commit-every", fmt.Sprint(commit),
				"--checkpoint", dir, "--checkpoint-every-steps", fmt.Sprint(every))...)
			newest := 0 // the newest checkpoint saved, of the events seen until the restore
			saved := func(e jobtest.Event) {
				if e["event"] == "checkpoint_saved" {
					newest = max(newest, jobtest.Num(e, "step"))
				}
			}
			j.Until(t, "a checkpoint", func(e jobtest.Event) bool {
				saved(e)
				return e["event"] == "checkpoint_saved" && jobtest.Num(e, "step") >= 2*every
			})
			pids := j.WorkerPids()
			for _, k := range c.kill {
				jobtest.Kill(t, pids[k], syscall.SIGKILL)
			}
			exited := map[int]bool{}
			j.Until(t, fmt.Sprintf("workers %v exited", c.kill), func(e jobtest.Event) bool {
				saved(e)
				if e["event"] == "worker_exited" {
					exited[jobtest.Num(e, "worker")] = true
				}
				for _, k := range c.kill {
					if !exited[k] {
						return false
					}
				}
				return true
			})
			// Stage 1's (the killed one's) event: stage 0 reports its own
			// rollback too (source commit when its state stayed with it).
			r := j.Until(t, "stage 1's stage_restored", func(e jobtest.Event) bool {
				saved(e)
				return e["event"] == "stage_restored" && jobtest.Num(e, "stage") == 1
			})
			switch at := jobtest.Num(r, "step"); {
			case r["source"] != c.source:
				t.Errorf("stage_restored %v, want from the %s", r, c.source)
			case c.redone >= 0 && jobtest.Num(r, "steps_redone") > c.redone:
				t.Errorf("stage_restored %v, want at most %d steps redone", r, c.redone)
			case c.redone < 0 && (at%every != 0 || at < newest || jobtest.Num(r, "steps_redone") < 0):
				t.Errorf("stage_restored %v, want the checkpoint of a step of %d's no older than step %d, the newest saved by then", r, every, newest)
			}
			ev := j.Finish(t)
			if n := len(ev["worker_started"]); n != 2+len(c.kill) {
				t.Errorf("%d workers started, want 2 and %d replacements", n, len(c.kill))
			}
			if d := doneOf(t, ev); jobtest.Num(d, "step") != steps {
				t.Errorf("done %v, want step %d", d, steps)
			}
		})
	}
}

// TestPipelineSIGTERM: SIGTERM to the launcher of a --dp 2 --pp 2 job
// makes every worker stop at the same step boundary after replica 0's
// stages save it; the launcher exits 3 naming that final checkpoint; the
// same command resumes there and ends with bitwise the model of a run that
// was never stopped.
func TestPipelineSIGTERM(t *testing.T) {
	dir := t.TempDir()
	args := func(steps int, more ...string) []string {
		return pipeArgs(steps, append([]string{"--dp", "2", "--pp", "2", "--micro-batches", "2", "--schedule", "constant"}, more...)...)
	}
	j := startJob(t, args(100000, "--checkpoint", dir, "--checkpoint-every-steps", "0")...)
	j.Until(t, "step 10", jobtest.StepIn(4, 10))
	if err := j.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	j.Until(t, "the stopping event", jobtest.Kind("stopping"))
	stop := j.Until(t, "the stopped event", jobtest.Kind("stopped"))
	_, err := j.End()
	if code := launch.ExitStatus(err); code != 3 {
		t.Fatalf("launcher exit %v, want status 3\n%s", err, jobtest.LastLines(j.Out.String(), 20))
	}
	at := jobtest.Num(stop, "step")
	var saved []jobtest.Event
	for _, e := range j.Seen {
		if e["event"] == "checkpoint_saved" {
			saved = append(saved, e)
		}
	}
	if len(saved) != 1 || jobtest.Num(saved[0], "step") != at {
		t.Fatalf("checkpoints saved %v, want one, at the stop step %d", saved, at)
	}
	if !strings.Contains(j.Out.String(), fmt.Sprintf("stopped at step %d; final checkpoint", at)) {
		t.Errorf("the launcher did not name the final checkpoint:\n%s", jobtest.LastLines(j.Out.String(), 10))
	}
	for _, e := range j.Seen {
		if e["event"] == "worker_started" && jobtest.Num(e, "worker") >= 4 {
			t.Errorf("a replacement worker was started for a stopping job: %v", e)
		}
	}

	ev := startJob(t, args(at+5, "--checkpoint", dir)...).Finish(t)
	if r := ev["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != at {
		t.Fatalf("resume: restored %v, want the stop step %d", r, at)
	}
	ref := doneOf(t, startJob(t, args(at+5)...).Finish(t))
	if d := doneOf(t, ev); d["parameters_crc32c"] != ref["parameters_crc32c"] || d["parameters_identical"] != true {
		t.Errorf("stopped at %d and resumed: model %v (replicas identical %v); never stopped: %v", at, d["parameters_crc32c"], d["parameters_identical"], ref["parameters_crc32c"])
	}
}

// TestPipelineCheckpointRetention: --checkpoint-keep 2 leaves the newest
// two pipeline checkpoints saved, each index with its stages' parts, and
// nothing of the older ones. (Which steps are saved depends on how long
// each save takes: a save starts only once the one before is settled.)
func TestPipelineCheckpointRetention(t *testing.T) {
	dir := t.TempDir()
	ev := startJob(t, pipeArgs(200, "--pp", "2", "--micro-batches", "2", "--checkpoint", dir, "--checkpoint-every-steps", "5",
		"--checkpoint-keep", "2")...).Finish(t)
	var saved []string
	for _, e := range ev["checkpoint_saved"] {
		saved = append(saved, fmt.Sprintf("%012d", jobtest.Num(e, "step")))
	}
	slices.Sort(saved)
	if len(saved) < 3 || saved[len(saved)-1] != fmt.Sprintf("%012d", 200) {
		t.Fatalf("checkpoints saved at steps %v: want at least three, the last the final one at 200", saved)
	}
	steps := func(glob string) []string {
		t.Helper()
		ms, err := filepath.Glob(filepath.Join(dir, "pipeline", glob))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			b := filepath.Base(m)
			out = append(out, b[strings.Index(b, "step-")+5:strings.Index(b, "step-")+17])
		}
		slices.Sort(out)
		return out
	}
	want := saved[len(saved)-2:]
	if got := steps("index-*"); !slices.Equal(got, want) {
		t.Errorf("indexes of steps %v, want the newest two saved %v (of %v)", got, want, saved)
	}
	for _, s := range []string{"p2-s0", "p2-s1"} {
		if got := steps(s + "/step-*"); !slices.Equal(got, want) {
			t.Errorf("stage parts %s of steps %v, want %v", s, got, want)
		}
	}
}
