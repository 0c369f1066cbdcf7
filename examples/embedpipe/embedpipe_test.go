package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
)

// TestMain makes the test binary this program: a pipeline worker when its
// launcher started it as one, the program itself when a test starts it so.
func TestMain(m *testing.M) {
	reg := phalanx.NewRegistry(model())
	phalanx.Main(reg)
	if os.Getenv("EMBEDPIPE_AS_PROGRAM") == "1" {
		os.Exit(run(reg, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// start runs this program with args as a real process.
func start(t *testing.T, args ...string) *jobtest.Job {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append(append([]string{"--threads", "1"}, jobtest.EventsFlag...), args...)...)
	cmd.Env = append(os.Environ(), "EMBEDPIPE_AS_PROGRAM=1")
	return jobtest.Start(t, cmd)
}

func doneOf(t *testing.T, ev map[string][]jobtest.Event) jobtest.Event {
	t.Helper()
	if len(ev["done"]) != 1 {
		t.Fatalf("%d done events, want 1", len(ev["done"]))
	}
	return ev["done"][0]
}

// TestEmbedPipeTrains: the program's own layers (a plain nn.Layer
// activation and a plain layer with parameters, whose stages recompute
// their forward passes) train through the library on 2 stages, under every
// schedule, to bitwise the model the same program trains on one stage, far
// above chance.
func TestEmbedPipeTrains(t *testing.T) {
	const steps = "200"
	ref := doneOf(t, start(t, "--pp", "1", "--steps", steps).Finish(t))
	scheds := []string{"1f1b", "gpipe", "zb-h1", "interleaved"}
	if testing.Short() { // the race pass: one schedule is enough for its data races
		scheds = scheds[:1]
	}
	for _, sched := range scheds {
		t.Run(sched, func(t *testing.T) {
			d := doneOf(t, start(t, "--pp", "2", "--pp-schedule", sched, "--steps", steps).Finish(t))
			if d["parameters_crc32c"] != ref["parameters_crc32c"] {
				t.Errorf("--pp 2 (%s) ended with model %v, --pp 1 with %v", sched, d["parameters_crc32c"], ref["parameters_crc32c"])
			}
			if acc := d["accuracy"].(float64); acc < 0.75 {
				t.Errorf("held-out accuracy %.3f after %s steps, want above 0.75 (4 rings)", acc, steps)
			}
		})
	}
}

// TestEmbedPipeStageKilled: 2 replicas of 2 stages of the program's own
// model; SIGKILL one stage process: its replica drops out, the other goes
// on, the launcher's replacement and the survivor re-form it with the
// live replica's state, and the job ends with the replicas identical.
func TestEmbedPipeStageKilled(t *testing.T) {
	steps := "4000"
	if testing.Short() { // the race pass's workers step several times slower
		steps = "1500"
	}
	j := start(t, "--dp", "2", "--pp", "2", "--steps", steps)
	j.Until(t, "step 20", func(e jobtest.Event) bool { return e["event"] == "pipeline_step" && jobtest.Num(e, "step") >= 20 })
	j.KillWorker(t, 3, syscall.SIGKILL) // replica 1, stage 1
	j.Until(t, "the replica dropped", jobtest.Kind("replica_dropped"))
	j.Until(t, "a replica formed", jobtest.Kind("replica_formed"))
	ev := j.Finish(t)
	d := doneOf(t, ev)
	if d["parameters_identical"] != true || fmt.Sprint(jobtest.Num(d, "step")) != steps {
		t.Errorf("done %v: want step %s with the replicas identical", d, steps)
	}
	if acc := d["accuracy"].(float64); acc < 0.8 {
		t.Errorf("held-out accuracy %.3f, want above 0.8", acc)
	}
	for _, r := range ev["stage_restored"] {
		t.Errorf("a stage was restored (%v): the live replica should have gone on, nothing rolled back", r)
	}
}
