package main

import (
	"encoding/json"
	"errors"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
)

var ckptJobArgs = []string{"--steps", "120", "--samples", "8000", "--batch", "256", "--hidden", "64", "--seed", "5",
	"--threads", "1", "--checkpoint-every-steps", "10", "--checkpoint-keep", "0"}

// minioForJobs starts a MinIO whose credentials the test's jobs take from
// the environment.
func minioForJobs(t *testing.T) *miniotest.Server {
	t.Helper()
	srv := miniotest.Start(t)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return srv
}

// s3Store opens the store at url with the test server's credentials.
func s3Store(t *testing.T, srv *miniotest.Server, url string) checkpoint.Store {
	t.Helper()
	l, err := checkpoint.ParseLocation(url)
	if err != nil {
		t.Fatal(err)
	}
	s, err := checkpoint.Open(testContext(t, storeWait), l, checkpoint.Credentials{AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatalf("opening the store %s: %v", url, err)
	}
	return s
}

// TestCheckpointKillAllResumeReshaped is the used-by scenario, end to end on
// real processes and a real MinIO: 4 workers checkpoint to S3 every 10
// steps; every worker is SIGKILLed at a random step in the middle of an
// epoch; 3 workers started afresh resume from the newest complete checkpoint
// and finish. Their final parameters and optimizer state are bitwise those of
// an undisturbed 3-worker run resumed from a copy of the same checkpoint
// (same world, so the same summation order), and every sample of every epoch
// was trained exactly once across the two jobs. Then a flipped byte in the
// final checkpoint makes a resume take the one before, say why, and write a
// new final checkpoint identical to the first, overwriting nothing.
func TestCheckpointKillAllResumeReshaped(t *testing.T) {
	srv := minioForJobs(t)
	url := srv.URL("phalanx/kill-all")
	store := s3Store(t, srv, url)
	killAt := 40 + rand.IntN(20) // epoch 2 runs from step 33 to 63
	t.Logf("killing every worker after step %d", killAt)

	a := startJob(t, append([]string{"--workers", "4", "--checkpoint", url}, ckptJobArgs...)...)
	a.Until(t, "a checkpoint saved", func(e jobtest.Event) bool { return e["event"] == "checkpoint_saved" })
	a.Until(t, "step "+strconv.Itoa(killAt), jobtest.StepIn(4, killAt))
	for _, pid := range a.WorkerPids() {
		jobtest.Kill(t, pid, syscall.SIGKILL)
	}
	a.Cmd.Process.Kill()
	a.End()
	resumeFrom := jobtest.NewestComplete(t, store)
	if resumeFrom.World != 4 || resumeFrom.Step > int64(killAt) || resumeFrom.Step < 10 {
		t.Fatalf("newest complete checkpoint: step %d, world %d", resumeFrom.Step, resumeFrom.World)
	}
	refURL := srv.URL("phalanx/reference")
	jobtest.CopyCheckpoint(t, store, s3Store(t, srv, refURL), resumeFrom.Id)

	b := startJob(t, append([]string{"--workers", "3", "--checkpoint", url, "--resume"}, ckptJobArgs...)...)
	evB := b.Finish(t)
	r := evB["checkpoint_restored"]
	if len(r) != 1 || jobtest.Num(r[0], "step") != int(resumeFrom.Step) || jobtest.Num(r[0], "world_before") != 4 || jobtest.Num(r[0], "world_after") != 3 ||
		!strings.Contains(r[0]["url"].(string), "/"+resumeFrom.Id+"?endpoint=") {
		t.Fatalf("checkpoint_restored events %v, want one of %s (step %d) from 4 workers to 3", r, resumeFrom.Id, resumeFrom.Step)
	}
	var steps []jobtest.Event
	for _, e := range a.Seen {
		if e["event"] == "step" && jobtest.Num(e, "step") <= int(resumeFrom.Step) {
			steps = append(steps, e)
		}
	}
	steps = append(steps, evB["step"]...)
	jobtest.CheckSamples(t, steps, 120, 8000, 256, 5)
	finalB := jobtest.NewestComplete(t, store)
	if finalB.Step != 120 || finalB.World != 3 {
		t.Fatalf("final checkpoint of the resumed job: step %d world %d", finalB.Step, finalB.World)
	}

	ref := startJob(t, append([]string{"--workers", "3", "--checkpoint", refURL, "--resume"}, ckptJobArgs...)...).Finish(t)
	finalRef := jobtest.NewestComplete(t, s3Store(t, srv, refURL))
	if !slices.Equal(jobtest.TensorSums(finalB), jobtest.TensorSums(finalRef)) || finalB.Step != finalRef.Step {
		t.Fatalf("the resumed job's final state differs from the undisturbed resume's")
	}
	if evB["done"][0]["accuracy"] != ref["done"][0]["accuracy"] || evB["done"][0]["loss"] != ref["done"][0]["loss"] {
		t.Fatalf("done: %v vs %v", evB["done"][0], ref["done"][0])
	}
	t.Logf("resumed at step %d from 4 workers to 3; final state bitwise equal to the reference; accuracy %v",
		resumeFrom.Step, evB["done"][0]["accuracy"])

	// A flipped byte in the final checkpoint: the resume says why and takes
	// step 110's; retraining 10 steps writes a new, identical final one.
	ctx := testContext(t, storeWait)
	obj := finalB.Id + "/" + finalB.Objects[1].Name
	buf := make([]byte, finalB.Objects[1].Bytes)
	if err := store.ReadAt(ctx, obj, buf, 0); err != nil {
		t.Fatalf("reading %s: %v", obj, err)
	}
	buf[len(buf)/2] ^= 1
	if err := store.Delete(ctx, obj); err != nil { // the test rewrites it, as a failing disk would
		t.Fatalf("deleting %s: %v", obj, err)
	}
	if err := store.Put(ctx, obj, buf); err != nil {
		t.Fatalf("rewriting %s: %v", obj, err)
	}
	c := startJob(t, append([]string{"--workers", "3", "--checkpoint", url}, ckptJobArgs...)...).Finish(t)
	sk, rs := c["checkpoint_skipped"], c["checkpoint_restored"]
	if len(sk) == 0 || sk[0]["checkpoint"] != finalB.Id || !strings.Contains(sk[0]["error"].(string), "checksum") ||
		len(rs) != 1 || jobtest.Num(rs[0], "step") != 110 {
		t.Fatalf("skipped %v, restored %v: want %s skipped for its checksum and step 110 restored", sk, rs, finalB.Id)
	}
	again := jobtest.NewestComplete(t, store)
	if again.Id == finalB.Id || again.Step != 120 || !slices.Equal(jobtest.TensorSums(again), jobtest.TensorSums(finalB)) {
		t.Fatalf("the retrained final checkpoint %s differs from %s", again.Id, finalB.Id)
	}
	if err := checkpoint.Verify(testContext(t, storeWait), store, again); err != nil {
		t.Fatalf("verifying %s: %v", again.Id, err)
	}
}

// TestCheckpointSIGTERM: SIGTERM to the launcher makes every worker take a
// final checkpoint at the next step boundary and stop; the launcher exits 3;
// the same command resumes from that step.
func TestCheckpointSIGTERM(t *testing.T) {
	dir := t.TempDir()
	args := append([]string{"--workers", "2", "--checkpoint", dir}, ckptJobArgs...)
	args = append(args, "--checkpoint-every-steps", "0", "--steps", "100000")
	j := startJob(t, args...)
	j.Until(t, "step 15", jobtest.StepIn(2, 15))
	if err := j.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stop := j.Until(t, "the stopped event", jobtest.Kind("stopped"))
	_, err := j.End()
	if code := launch.ExitStatus(err); code != 3 {
		t.Fatalf("launcher exit %v, want status 3", err)
	}
	var saved []jobtest.Event
	for _, e := range j.Seen {
		if e["event"] == "checkpoint_saved" {
			saved = append(saved, e)
		}
	}
	if len(saved) != 1 || jobtest.Num(saved[0], "step") != jobtest.Num(stop, "step") {
		t.Fatalf("checkpoints saved %v, want one at the stop step %v", saved, stop["step"])
	}
	store, err := checkpoint.NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := jobtest.NewestComplete(t, store); m.Step != int64(jobtest.Num(stop, "step")) {
		t.Fatalf("newest checkpoint at step %d, want %v", m.Step, stop["step"])
	}
	args[len(args)-1] = strconv.Itoa(jobtest.Num(stop, "step") + 5)
	ev := startJob(t, args...).Finish(t)
	if r := ev["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != jobtest.Num(stop, "step") || len(ev["step"]) != 5 {
		t.Fatalf("resume: restored %v, %d steps trained; want the stop step and 5", r, len(ev["step"]))
	}
}

// TestCkptCommand: ls, inspect, verify and rm on the checkpoints of a small
// job, and verify naming a flipped byte.
func TestCkptCommand(t *testing.T) {
	t.Setenv("PHALANX_TEST_AS_COMMAND", "1") // the launcher's workers re-execute this binary
	dir := t.TempDir()
	var out strings.Builder
	if err := runCommand(t, []string{"train", "--workers", "1", "--checkpoint", dir, "--steps", "6", "--checkpoint-every-steps", "2",
		"--samples", "1000", "--hidden", "16", "--checkpoint-keep", "0"}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	ck := func(args ...string) (string, error) {
		var b strings.Builder
		err := runCommand(t, append([]string{"ckpt"}, args...), &b, &b)
		return b.String(), err
	}
	ls, err := ck("ls", "--checkpoint", dir)
	if err != nil || strings.Count(ls, "complete") != 3 || !strings.Contains(ls, "STEP") {
		t.Fatalf("ls: %v\n%s", err, ls)
	}
	store, _ := checkpoint.NewLocalStore(dir)
	newest := jobtest.NewestComplete(t, store)
	js, err := ck("inspect", newest.Id, "--checkpoint", dir, "--json")
	var shown jobtest.Event
	if err != nil || json.Unmarshal([]byte(js), &shown) != nil || shown["step"] != "6" || shown["blockCrc32c"] == nil {
		t.Fatalf("inspect --json: %v\n%s", err, js)
	}
	// The summary: where training was, the tensors with their shapes, each
	// object present; a dozen lines, not the manifest's hundreds.
	sum, err := ck("inspect", newest.Id, "--checkpoint", dir)
	for _, want := range []string{"checkpoint " + newest.Id + "\n", "  step 6 (epoch ", "by 1 workers", "TENSOR", "parameter  [784 16]",
		newest.Objects[0].Name + "  0     ", "present\n"} {
		if err != nil || !strings.Contains(sum, want) {
			t.Fatalf("inspect: %v; lacks %q:\n%s", err, want, sum)
		}
	}
	if n := strings.Count(sum, "\n"); n > 12+len(newest.Tensors)+len(newest.Objects) {
		t.Errorf("inspect printed %d lines:\n%s", n, sum)
	}
	if v, err := ck("verify", "--checkpoint", dir); err != nil || strings.Count(v, ": ok") != 3 {
		t.Fatalf("verify: %v\n%s", err, v)
	}
	obj := dir + "/" + newest.Id + "/" + newest.Objects[0].Name
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[7] ^= 0x80
	if err := os.WriteFile(obj, b, 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := ck("verify", "--checkpoint", dir)
	if err == nil || !strings.Contains(v, newest.Id+": CORRUPT") || !strings.Contains(v, newest.Objects[0].Name) || strings.Count(v, ": ok") != 2 {
		t.Fatalf("verify after a flipped byte: %v\n%s", err, v)
	}
	// ls calls it complete (its manifest is whole); ls --verify says it
	// does not verify, and the others do.
	if ls, err := ck("ls", "--checkpoint", dir, "--verify"); err != nil || !strings.Contains(ls, "VERIFIED") || strings.Count(ls, "  yes") != 2 ||
		!strings.Contains(ls, "NO: ") || !strings.Contains(ls[strings.Index(ls, newest.Id):], "NO: ") {
		t.Fatalf("ls --verify after a flipped byte: %v\n%s", err, ls)
	}
	if err := os.Remove(obj); err != nil {
		t.Fatal(err)
	}
	if sum, err := ck("inspect", newest.Id, "--checkpoint", dir); err == nil || !strings.Contains(sum, newest.Objects[0].Name+"  0     99.5 KiB  MISSING") {
		t.Fatalf("inspect with an object gone: %v\n%s", err, sum)
	}
	// One byte of another checkpoint's manifest changed: its own checksum
	// no longer matches, and verify and ls say so.
	infos, err := checkpoint.List(testContext(t, storeWait), store)
	if err != nil || len(infos) != 3 {
		t.Fatalf("list: %v %+v", err, infos)
	}
	changed := infos[1].ID
	mp := filepath.Join(dir, changed, checkpoint.ManifestName)
	mb, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	mb[len(mb)/2] ^= 0x01
	if err := os.WriteFile(mp, mb, 0o644); err != nil {
		t.Fatal(err)
	}
	v, err = ck("verify", "--checkpoint", dir)
	if err == nil || !strings.Contains(v, changed+": CORRUPT") || !strings.Contains(v, "changed or damaged") || strings.Count(v, ": ok") != 1 {
		t.Fatalf("verify after a changed manifest byte: %v\n%s", err, v)
	}
	if ls, err := ck("ls", "--checkpoint", dir); err != nil || !strings.Contains(ls, "unreadable manifest") || strings.Count(ls, "complete") != 2 {
		t.Fatalf("ls after a changed manifest byte: %v\n%s", err, ls)
	}
	if rm, err := ck("rm", "--checkpoint", dir, "--keep", "1", "--dry-run"); err != nil || strings.Count(rm, "would delete") != 2 {
		t.Fatalf("rm --dry-run: %v\n%s", err, rm)
	}
	if rm, err := ck("rm", newest.Id, "--checkpoint", dir); err != nil || !strings.Contains(rm, "deleted "+newest.Id) {
		t.Fatalf("rm: %v\n%s", err, rm)
	}
	if ls, _ := ck("ls", "--checkpoint", dir); strings.Contains(ls, newest.Id) {
		t.Fatalf("ls after rm still shows it:\n%s", ls)
	}
	missing := filepath.Join(t.TempDir(), "nothing-here")
	if ls, err := ck("ls", "--checkpoint", missing); err != nil || !strings.Contains(ls, "nothing at "+missing) || strings.Contains(ls, "STEP") {
		t.Errorf("ls of a missing directory: %v\n%s", err, ls)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ls created %s: %v", missing, err)
	}
	if ls, err := ck("ls", "--checkpoint", t.TempDir()); err != nil || !strings.Contains(ls, "no checkpoints at") {
		t.Errorf("ls of an empty directory: %v\n%s", err, ls)
	}
	for _, bad := range [][]string{{"ls"}, {"inspect", "--checkpoint", dir}, {"rm", "--checkpoint", dir}, {"frob"}, {"rm", "--checkpoint", dir, "--keep-every", "2"}} {
		if _, err := ck(bad...); exitCode(err) != 2 {
			t.Errorf("ckpt %v: %v, want a usage error", bad, err)
		}
	}
}

// TestCheckpointStoppedBelowMinimum: killing one of 3 workers of a job that
// needs 3 makes the coordinator stop it; one survivor (the one that claims
// it in etcd) writes a final checkpoint of the last commit alone; the
// launcher exits with status 4, the job stopped.
func TestCheckpointStoppedBelowMinimum(t *testing.T) {
	dir := t.TempDir()
	args := append([]string{"--workers", "3", "--min-workers", "3", "--min-workers-timeout", "500ms", "--checkpoint", dir}, ckptJobArgs...)
	args = append(args, "--checkpoint-every-steps", "0", "--steps", "100000")
	j := startJob(t, args...)
	j.Until(t, "step 12", jobtest.StepIn(3, 12))
	j.KillWorker(t, 1, syscall.SIGKILL)
	saved := j.Until(t, "the final checkpoint", jobtest.Kind("checkpoint_saved"))
	_, err := j.End()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 || !strings.Contains(j.Out.String(), "the coordinator stopped the job") {
		t.Fatalf("launcher: %v, want exit status 4 (the job stopped) with the coordinator's stop reported", err)
	}
	last := 0
	for _, e := range j.Seen {
		if e["event"] == "step" {
			last = max(last, jobtest.Num(e, "step"))
		}
	}
	// Rank 0 reported step 12 when its reduction ended; a survivor whose
	// last bucket was still in flight when the ring broke committed step 11.
	if jobtest.Num(saved, "world") != 1 || jobtest.Num(saved, "step") < 11 || jobtest.Num(saved, "step") > last {
		t.Fatalf("final checkpoint %v: want one of world 1 at the claimer's last commit (11..%d)", saved, last)
	}
	store, _ := checkpoint.NewLocalStore(dir)
	m := jobtest.NewestComplete(t, store)
	if err := checkpoint.Verify(testContext(t, storeWait), store, m); err != nil || m.Step != int64(jobtest.Num(saved, "step")) {
		t.Fatalf("checkpoint %s step %d: %v", m.Id, m.Step, err)
	}
	var finals int
	for _, e := range j.Seen {
		if e["event"] == "checkpoint_saved" {
			finals++
		}
	}
	if finals != 1 {
		t.Fatalf("%d checkpoints saved, want the one final", finals)
	}
}

// TestCheckpointTrainLonger: resuming with more steps and another
// learning-rate schedule trains on from the checkpoint without a warning;
// another batch size is a real mismatch and is warned about.
func TestCheckpointTrainLonger(t *testing.T) {
	dir, evDir := t.TempDir(), t.TempDir()
	job := func(name string, extra ...string) (map[string][]jobtest.Event, string) {
		path := filepath.Join(evDir, name)
		args := append([]string{"train", "--workers", "2", "--checkpoint", dir, "--samples", "1000", "--hidden", "16", "--batch", "64",
			"--events", path}, extra...)
		var out strings.Builder
		if err := runCommand(t, args, &out, &out); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		return readEvents(t, path), out.String()
	}
	job("first.jsonl", "--steps", "6")
	ev, out := job("longer.jsonl", "--steps", "10", "--lr", "0.02", "--schedule", "step")
	r := ev["checkpoint_restored"]
	if len(r) != 1 || r[0]["step"] != 6.0 || r[0]["config_changed"] != false || strings.Contains(out, "warning") {
		t.Fatalf("resumed with more steps and another schedule: %v\n%s", r, out)
	}
	if d := ev["done"]; len(d) != 1 || d[0]["step"] != 10.0 {
		t.Fatalf("done %v, want step 10", d)
	}
	ev, out = job("batch.jsonl", "--steps", "12", "--batch", "32")
	if r := ev["checkpoint_restored"]; len(r) != 1 || r[0]["step"] != 10.0 || r[0]["config_changed"] != true || !strings.Contains(out, "warning: that checkpoint was written with other training settings") {
		t.Fatalf("resumed with another batch: %v\n%s", r, out)
	}
}

// TestResumeRefusedBeforeStart: a launch whose workers would refuse to
// resume is refused by the launcher before etcd or any worker starts, with
// the workers' own message: --resume on an empty store, and a model of
// another width onto a store of checkpoints.
func TestResumeRefusedBeforeStart(t *testing.T) {
	t.Setenv("PHALANX_TEST_AS_COMMAND", "1") // the launcher's workers re-execute this binary
	dir := t.TempDir()
	job := []string{"--workers", "1", "--checkpoint", dir, "--steps", "4", "--checkpoint-every-steps", "2", "--samples", "1000"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"--resume on an empty store", append([]string{"--resume", "--hidden", "16"}, job...), "no checkpoint to resume from"},
		{"a 16-wide model", append([]string{"--hidden", "16"}, job...), ""},
		{"a 32-wide model onto the 16-wide one's checkpoints", append([]string{"--hidden", "32"}, job...),
			"cannot be resumed by this job: checkpoint step-"}, {"its message names the layouts", append([]string{"--hidden", "32"}, job...), "this model's is dense1.W[784 32]"},
	} {
		var out strings.Builder
		err := runCommand(t, append([]string{"train"}, c.args...), &out, &out)
		switch {
		case c.want == "" && err != nil:
			t.Fatalf("%s: %v\n%s", c.name, err, out.String())
		case c.want == "":
		case err == nil || !strings.Contains(err.Error(), c.want):
			t.Fatalf("%s: %v, want an error saying %q\n%s", c.name, err, c.want, out.String())
		case strings.Contains(out.String(), "etcd"):
			t.Fatalf("%s: refused only after the job started:\n%s", c.name, out.String())
		}
	}
}
