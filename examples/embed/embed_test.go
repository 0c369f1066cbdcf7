package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
)

// TestMain makes the test binary this program: a worker when its launcher
// started it as one, the program itself when a test starts it so.
func TestMain(m *testing.M) {
	reg := phalanx.NewRegistry(model())
	phalanx.Main(reg)
	if os.Getenv("EMBED_AS_PROGRAM") == "1" {
		os.Exit(run(reg, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// startEmbed runs this program with args as a real process.
func startEmbed(t *testing.T, args ...string) *jobtest.Job {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append(append([]string{"--threads", "1"}, jobtest.EventsFlag...), args...)...)
	cmd.Env = append(os.Environ(), "EMBED_AS_PROGRAM=1")
	return jobtest.Start(t, cmd)
}

// TestEmbedKillAndLeave: the program trains on 3 processes of its own
// binary. One is SIGKILLed mid-epoch: the other two go on in a new ring at
// once, with no step redone. Later another is sent SIGTERM: it leaves
// gracefully (the coordinator names it as left, it exits 0), the ring
// shrinks to one and the job finishes, every sample of every epoch trained
// exactly once and the parameters identical.
func TestEmbedKillAndLeave(t *testing.T) {
	const steps = 300
	j := startEmbed(t, "--workers", "3", "--steps", "300", "--checkpoint", t.TempDir(), "--lease-ttl", "10s")
	j.Until(t, "step 40 in a ring of 3", jobtest.StepIn(3, 40)) // epoch 0 ends at step 62
	pids := j.WorkerPids()
	jobtest.Kill(t, pids[1], syscall.SIGKILL)
	j.Until(t, "a ring of 2", jobtest.WorldIs(2))
	j.Until(t, "step 100 in a ring of 2", jobtest.StepIn(2, 100)) // mid-epoch 1
	jobtest.Kill(t, pids[2], syscall.SIGTERM)
	j.Until(t, "a ring of 1", jobtest.WorldIs(1))
	ev := j.Finish(t)

	jobtest.CheckSamples(t, ev["step"], steps, 6000, 96, 1)
	if l := ev["worker_lost"]; len(l) != 1 || jobtest.Num(l[0], "pid") != pids[1] {
		t.Errorf("worker_lost %v, want pid %d", l, pids[1])
	}
	if l := ev["worker_left"]; len(l) != 1 || jobtest.Num(l[0], "pid") != pids[2] || !strings.Contains(l[0]["detected_by"].(string), "left on request") {
		t.Errorf("worker_left %v, want pid %d, left on request", l, pids[2])
	}
	if r := ev["restored"]; len(r) != 2 {
		t.Errorf("restored %v, want one per new ring", r)
	}
	for _, r := range ev["restored"] {
		if jobtest.Num(r, "steps_redone") != 0 {
			t.Errorf("restored %v: steps redone", r)
		}
	}
	for _, x := range ev["worker_exited"] {
		if w := jobtest.Num(x, "worker"); w != 1 && x["status"] != "exit 0" {
			t.Errorf("worker %d: %v, want exit 0 (the one that left too)", w, x)
		}
	}
	d := ev["done"]
	if len(d) != 1 || jobtest.Num(d[0], "world") != 1 || d[0]["parameters_identical"] != true || d[0]["accuracy"].(float64) < 0.9 {
		t.Fatalf("done %v, want the job done by one worker at accuracy 0.9 or more", d)
	}
	t.Logf("done after a kill and a leave: %v", d[0])
}

// TestEmbedResumeTwoWorkers: 3 workers checkpoint every 20 steps; all of
// them (and the program) are SIGKILLed; 2 workers resume from the newest
// checkpoint. The result equals, bitwise, that of 2 workers resumed from a
// copy of the same checkpoint without anything else happening.
func TestEmbedResumeTwoWorkers(t *testing.T) {
	dir, ref := t.TempDir(), t.TempDir()
	a := startEmbed(t, "--workers", "3", "--checkpoint", dir, "--checkpoint-every-steps", "20")
	a.Until(t, "a checkpoint", jobtest.Kind("checkpoint_saved"))
	a.Until(t, "step 70", jobtest.StepIn(3, 70))
	for _, pid := range a.WorkerPids() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	a.Cmd.Process.Kill()
	a.End()

	store, err := checkpoint.NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	from := jobtest.NewestComplete(t, store)
	if from.World != 3 || from.Step < 20 || from.Step > 70 {
		t.Fatalf("newest complete checkpoint: step %d of world %d", from.Step, from.World)
	}
	refStore := mustStore(t, ref)
	jobtest.CopyCheckpoint(t, store, refStore, from.Id)

	resumed := startEmbed(t, "--workers", "2", "--checkpoint", dir).Finish(t)
	undisturbed := startEmbed(t, "--workers", "2", "--checkpoint", ref).Finish(t)
	for name, ev := range map[string]map[string][]jobtest.Event{"resumed": resumed, "undisturbed": undisturbed} {
		if r := ev["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != int(from.Step) || jobtest.Num(r[0], "world_after") != 2 {
			t.Fatalf("%s: checkpoint_restored %v, want step %d into 2 workers", name, r, from.Step)
		}
	}
	got, want := jobtest.NewestComplete(t, store), jobtest.NewestComplete(t, refStore)
	if got.Step != 200 || want.Step != 200 || !slices.Equal(jobtest.TensorSums(got), jobtest.TensorSums(want)) {
		t.Fatalf("final checkpoints differ: step %d %v, step %d %v", got.Step, jobtest.TensorSums(got), want.Step, jobtest.TensorSums(want))
	}
	a2, b2 := resumed["done"][0], undisturbed["done"][0]
	if a2["loss"] != b2["loss"] || a2["accuracy"] != b2["accuracy"] {
		t.Fatalf("done %v resumed after the kill, %v undisturbed", a2, b2)
	}
	t.Logf("resumed from step %d: %v", from.Step, a2)
}

func mustStore(t *testing.T, dir string) checkpoint.Store {
	t.Helper()
	s, err := checkpoint.NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
