package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/minioserver"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
)

// TestCredentialsNeverLogged: S3 credentials given on the launcher's
// command line (--s3-access-key, --s3-secret-key) reach every process that
// needs them (the job checkpoints to a real MinIO that accepts only them)
// and appear nowhere else: not in any file of the job directory (logs/ at
// debug level, etcd's data), not in an event, not in the launcher's
// terminal output, and not on the command line of any process the launcher
// started, read from /proc while they run. For a ring job and for a
// parameter-server job (servers and workers); and a launch refused for a
// wrong secret does not print it either.
func TestCredentialsNeverLogged(t *testing.T) {
	bin := miniotest.RequireBinary(t)
	access, secret := canary(t, "phalanx-canary-access-"), canary(t, "phalanx-canary-secret-")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := minioserver.Start(ctx, minioserver.Config{Binary: bin, Dir: t.TempDir(), AccessKey: access, SecretKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	secrets := map[string]string{"the access key": access, "the secret key": secret}

	for _, tc := range []struct {
		name string
		args []string
		// roles of the processes the launcher starts, and how many of each
		roles map[string]int
	}{
		{"ring", []string{"--workers", "2", "--steps", "24", "--batch", "64", "--samples", "512", "--hidden", "16",
			"--checkpoint-every-steps", "8"}, map[string]int{"worker": 2}},
		{"parameter-server", []string{"--example", "sparse-lr", "--workers", "2", "--ps-servers", "2", "--epochs", "1",
			"--examples", "20000", "--held-out", "2000", "--ids", "20000", "--checkpoint-every-steps", "30"},
			map[string]int{"ps-server": 2, "ps-worker": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			url := "s3://phalanx/creds-" + tc.name + "?endpoint=" + srv.Endpoint()
			args := append([]string{"--job-dir", dir, "--log-level", "debug", "--checkpoint", url,
				"--s3-access-key", access, "--s3-secret-key", secret}, tc.args...)
			j := jobtest.Start(t, credentialFreeCommand(t, append(append([]string{"train"}, jobtest.EventsFlag...), args...)...))

			// The launcher holds them on its own command line, as given: this
			// shows that reading /proc finds them where they are.
			if got := procFile(t, j.Cmd.Process.Pid, "cmdline"); !bytes.Contains(got, []byte(secret)) {
				t.Fatalf("the launcher's command line %q lacks the secret it was given: reading /proc is broken", got)
			}
			started := map[string]int{}
			for range total(tc.roles) {
				e := j.Until(t, "every process of the job started", jobtest.Kind("worker_started"))
				pid, role := jobtest.Num(e, "pid"), fmt.Sprint(e["role"])
				started[role]++
				// Read at once: the process runs (Start returns after the exec).
				cmdline := procFile(t, pid, "cmdline")
				leak(t, fmt.Sprintf("the command line of %s pid %d", role, pid), cmdline, secrets)
				// They travel in the environment, which only the process's
				// user can read: a leak check that cannot see them there
				// would prove nothing.
				if env := procFile(t, pid, "environ"); !bytes.Contains(env, []byte("AWS_SECRET_ACCESS_KEY="+secret+"\x00")) {
					t.Errorf("%s pid %d has no AWS_SECRET_ACCESS_KEY with the secret in its environment", role, pid)
				}
			}
			for role, n := range tc.roles {
				if started[role] != n {
					t.Fatalf("started %v, want %v", started, tc.roles)
				}
			}
			// Mid-job, every process below the launcher, whatever it started.
			j.Until(t, "a checkpoint saved", jobtest.Kind("checkpoint_saved"))
			kids := descendants(t, j.Cmd.Process.Pid)
			if len(kids) < total(tc.roles) {
				t.Errorf("%d processes below the launcher mid-job, want at least %d", len(kids), total(tc.roles))
			}
			for _, pid := range kids {
				if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
					leak(t, fmt.Sprintf("the command line of pid %d (below the launcher)", pid), cmdline, secrets)
				}
			}
			ev := j.Finish(t)
			if len(ev["checkpoint_saved"]) < 2 || len(ev["done"]) != 1 {
				t.Fatalf("%d checkpoints saved, %d done events: want at least 2 and 1 (the credentials must have worked)",
					len(ev["checkpoint_saved"]), len(ev["done"]))
			}
			for _, e := range j.Seen {
				line, err := json.Marshal(e)
				if err != nil {
					t.Fatal(err)
				}
				leak(t, fmt.Sprintf("the %v event", e["event"]), line, secrets)
			}
			leak(t, "the launcher's terminal output", []byte(j.Out.String()), secrets)
			logs := scanDir(t, dir, secrets)
			t.Logf("%d checkpoints saved to MinIO; %d processes' command lines and environments read while they ran, %d mid-job; %d events, %d bytes of terminal output and %d log files hold neither key",
				len(ev["checkpoint_saved"]), total(tc.roles), len(kids), len(j.Seen), len(j.Out.String()), logs)
			if logs < total(tc.roles) {
				t.Errorf("%d non-empty files in the job's logs/, want one per process at least (%d)", logs, total(tc.roles))
			}
		})
	}

	t.Run("refused", func(t *testing.T) {
		wrong := canary(t, "phalanx-canary-wrong-")
		dir := t.TempDir()
		j := jobtest.Start(t, credentialFreeCommand(t, "train", jobtest.EventsFlag[0], jobtest.EventsFlag[1], "--job-dir", dir,
			"--log-level", "debug", "--workers", "2", "--steps", "4", "--checkpoint", "s3://phalanx/refused?endpoint="+srv.Endpoint(),
			"--s3-access-key", access, "--s3-secret-key", wrong))
		if _, err := j.End(); err == nil {
			t.Fatalf("a launch with a wrong secret key succeeded:\n%s", j.Out.String())
		}
		if !strings.Contains(j.Out.String(), "checkpoint") {
			t.Errorf("the refusal does not name the checkpoint store:\n%s", j.Out.String())
		}
		t.Logf("refused: %s", strings.TrimSpace(jobtest.LastLines(j.Out.String(), 3)))
		bad := map[string]string{"the access key": access, "the wrong secret key": wrong}
		leak(t, "the refused launcher's terminal output", []byte(j.Out.String()), bad)
		for _, e := range j.Seen {
			line, _ := json.Marshal(e)
			leak(t, fmt.Sprintf("the refused launch's %v event", e["event"]), line, bad)
		}
		scanDir(t, dir, bad)
	})
}

// canary is a distinctive string, different every run: found anywhere, it
// can only have come from this test's job.
func canary(t *testing.T, prefix string) string {
	t.Helper()
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// credentialFreeCommand is command without any S3 credentials in the
// launcher's environment: the flags are their only source.
func credentialFreeCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := command(t, args...)
	env := cmd.Env[:0]
	for _, kv := range cmd.Env {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD",
			"MINIO_ACCESS_KEY", "MINIO_SECRET_KEY", "AWS_SHARED_CREDENTIALS_FILE":
		default:
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "HOME="+t.TempDir()) // no ~/.aws/credentials either
	return cmd
}

// leak fails the test if b holds any of secrets, naming where and which.
func leak(t *testing.T, where string, b []byte, secrets map[string]string) {
	t.Helper()
	for what, s := range secrets {
		if i := bytes.Index(b, []byte(s)); i >= 0 {
			t.Errorf("%s holds %s: ...%q...", where, what, b[max(0, i-80):min(len(b), i+len(s)+20)])
		}
	}
}

// scanDir checks every regular file under dir for secrets and returns
// how many non-empty files its logs/ holds.
func scanDir(t *testing.T, dir string, secrets map[string]string) (logs int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		leak(t, "the job directory's "+rel, b, secrets)
		if strings.HasPrefix(rel, "logs"+string(filepath.Separator)) && len(b) > 0 {
			logs++
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the job directory %s: %v", dir, err)
	}
	return logs
}

// procFile reads /proc/<pid>/<name> of a running process. Right after a
// fork and exec, Start may return (the exec has closed its pipe) before the
// kernel has set the new program's arguments and environment, which read
// empty until then: so it polls, with a deadline, until they are there.
func procFile(t *testing.T, pid int, name string) []byte {
	t.Helper()
	path := fmt.Sprintf("/proc/%d/%s", pid, name)
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		if len(b) > 0 {
			return b
		}
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || procState(stat) == "Z" {
			t.Fatalf("%s is empty: pid %d has exited", path, pid)
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("waited 10s for %s of a running process to be set", path)
		}
	}
}

// procState is the state field of /proc/<pid>/stat ("R", "S", "Z", ...).
func procState(stat []byte) string {
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// descendants are the pids of every process below root now.
func descendants(t *testing.T, root int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	for pid := range parent {
		for p := parent[pid]; p > 1; p = parent[p] {
			if p == root {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

func total(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}
