package main

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
)

// TestCredentialsNeverShown: a job checkpointing to a real MinIO, logging
// at debug level, shows its S3 credentials nowhere another user or a log
// reader could see them: not in any worker's command line (read from
// /proc/<pid>/cmdline while it runs), not in the events, not in any file
// of the job's logs/, not on the launcher's terminal.
func TestCredentialsNeverShown(t *testing.T) {
	srv := minioForJobs(t)
	secrets := map[string]string{"access key": srv.AccessKey, "secret key": srv.SecretKey}
	jobDir := t.TempDir()
	j := startJob(t, "--workers", "2", "--checkpoint", srv.URL("phalanx/creds"), "--checkpoint-every-steps", "5",
		"--steps", "40", "--samples", "2000", "--batch", "64", "--hidden", "16", "--threads", "1",
		"--log-level", "debug", "--job-dir", jobDir)
	j.Until(t, "step 1 in a ring of 2", jobtest.StepIn(2, 1))
	pids := j.WorkerPids()
	if len(pids) != 2 {
		t.Fatalf("worker pids %v, want 2", pids)
	}
	// Stopped while their command lines are read, so that they cannot exit
	// in between.
	var all []int
	for _, pid := range pids {
		all = append(all, pid)
	}
	jobtest.Freeze(t, all...)
	for i, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			t.Fatalf("worker %d (pid %d) is not running at step 1: %v", i, pid, err)
		}
		line := strings.ReplaceAll(string(b), "\x00", " ")
		for what, s := range secrets {
			if strings.Contains(line, s) {
				t.Errorf("the %s is on worker %d's command line: %s", what, i, line)
			}
		}
	}
	jobtest.Thaw(all...)
	ev := j.Finish(t)
	if len(ev["checkpoint_saved"]) == 0 {
		t.Fatalf("no checkpoint saved: the credentials were never used")
	}
	for _, e := range j.Seen {
		b, _ := json.Marshal(e)
		for what, s := range secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("the %s is in an event: %s", what, b)
			}
		}
	}
	for what, s := range secrets {
		if strings.Contains(j.Out.String(), s) {
			t.Errorf("the %s is on the launcher's terminal", what)
		}
	}
	files, debugLines := 0, 0
	err := filepath.WalkDir(filepath.Join(jobDir, "logs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		debugLines += strings.Count(string(b), `"level":"debug"`)
		for what, s := range secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("the %s is in %s", what, path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 3 || debugLines == 0 {
		t.Fatalf("%d log files with %d debug lines under %s: want the launcher's and each worker's, at debug level", files, debugLines, jobDir)
	}
	t.Logf("%d log files, %d debug lines, %d events, %d checkpoints: no credential", files, debugLines, len(j.Seen), len(ev["checkpoint_saved"]))
}

// TestRerunFinishedJob: the same command run again on the checkpoint of a
// job that already trained its last step trains nothing: no step event,
// the final checkpoint restored, and a done event with the first run's
// held-out accuracy and loss and parameters' checksum; the newest
// checkpoint still holds the first run's final state, bitwise.
func TestRerunFinishedJob(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--workers", "2", "--checkpoint", dir, "--steps", "20", "--checkpoint-every-steps", "10",
		"--samples", "2000", "--batch", "64", "--hidden", "16", "--seed", "7", "--threads", "1"}
	first := startJob(t, args...).Finish(t)
	store, err := checkpoint.NewLocalStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	final := jobtest.NewestComplete(t, store)
	if final.Step != 20 || len(first["step"]) != 20 || len(first["done"]) != 1 {
		t.Fatalf("first run: final checkpoint at step %d, %d steps, done %v", final.Step, len(first["step"]), first["done"])
	}
	again := startJob(t, args...).Finish(t)
	if n := len(again["step"]); n != 0 {
		t.Errorf("the rerun trained %d steps (first %v), want none", n, again["step"][0])
	}
	if r := again["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != 20 {
		t.Errorf("checkpoint_restored %v, want the final checkpoint's step 20", r)
	}
	a, b := first["done"][0], again["done"]
	if len(b) != 1 || jobtest.Num(b[0], "step") != 20 || b[0]["accuracy"] != a["accuracy"] || b[0]["loss"] != a["loss"] ||
		b[0]["parameters_identical"] != true || a["parameters_crc32c"] == nil || b[0]["parameters_crc32c"] != a["parameters_crc32c"] {
		t.Fatalf("done %v on the rerun, want the first run's %v", b, a)
	}
	now := jobtest.NewestComplete(t, store)
	if now.Step != 20 || !slices.Equal(jobtest.TensorSums(now), jobtest.TensorSums(final)) {
		t.Fatalf("after the rerun the newest checkpoint %s (step %d) differs from the first run's final %s", now.Id, now.Step, final.Id)
	}
}
