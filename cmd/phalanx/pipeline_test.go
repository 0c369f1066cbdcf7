package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/phalanx-rt/phalanx/internal/jobtest"
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
// same order.
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
// replica's surviving stage waits as a spare. A fifth worker started by
// hand and the spare then re-form replica 1 from replica 0's parameters
// (replica_formed), and the job ends on two replicas, identical.
func TestPipelineStageKilled(t *testing.T) {
	// Long enough (a step takes about a millisecond) that the job still
	// runs when the fifth worker, started after the kill, joins.
	const steps = 8000
	j := startJob(t, pipeArgs(steps, "--dp", "2", "--pp", "2", "--micro-batches", "2")...)
	j.Until(t, "step 20", func(e jobtest.Event) bool { return e["event"] == "pipeline_step" && jobtest.Num(e, "step") >= 20 })
	victim := j.WorkerPids()[3] // replica 1, stage 1
	if victim <= 0 {
		t.Fatalf("no pid for worker 3: %v", j.WorkerPids())
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lost := j.Until(t, "stage_lost", jobtest.Kind("stage_lost"))
	if jobtest.Num(lost, "replica") != 1 || jobtest.Num(lost, "stage") != 1 {
		t.Errorf("stage_lost %v, want replica 1 stage 1", lost)
	}
	j.Until(t, "replica_dropped", func(e jobtest.Event) bool { return e["event"] == "replica_dropped" && jobtest.Num(e, "replica") == 1 })
	lay := j.Until(t, "the layout of one replica", func(e jobtest.Event) bool {
		return e["event"] == "pipeline_layout" && jobtest.Num(e, "replicas") == 1
	})
	if jobtest.Num(lay, "spares") != 1 {
		t.Errorf("layout %v, want the dead replica's survivor as a spare", lay)
	}
	j.Until(t, "a step on one replica", func(e jobtest.Event) bool { return e["event"] == "pipeline_step" && jobtest.Num(e, "replicas") == 1 })
	_, wait := startSpecWorker(t, j, "fifth")
	formed := j.Until(t, "replica_formed", jobtest.Kind("replica_formed"))
	if jobtest.Num(formed, "replica") != 1 || jobtest.Num(formed, "donor") != 0 {
		t.Errorf("replica_formed %v, want replica 1 from replica 0", formed)
	}
	ev := j.Finish(t)
	if err := wait(); err != nil {
		t.Errorf("the fifth worker: %v", err)
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
