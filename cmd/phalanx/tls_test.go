package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/pkitest"
	"github.com/phalanx-rt/phalanx/internal/sockowner"
	"github.com/phalanx-rt/phalanx/pki"
)

// TestTLSJob: a job with mutual TLS on every plane (its files from
// phalanx certs init) trains over the TCP data plane, checkpointing to
// MinIO; a worker's data plane and the job's etcd refuse plaintext; a
// SIGKILLed worker is removed and the two others go on; killed whole, the
// job resumes from MinIO with --tls auto (an ephemeral CA) and finishes.
// No log of either run, and no event, holds a line of either key's PEM
// body.
func TestTLSJob(t *testing.T) {
	srv := minioForJobs(t)
	url := srv.URL("phalanx/tls")
	store := s3Store(t, srv, url)
	dir := t.TempDir()
	files, err := pki.Init(filepath.Join(dir, "certs"), pki.InitOptions{Job: "tlsjob", Hosts: []string{"127.0.0.1"}, Now: time.Now(), Validity: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	f := files[0]
	logsA, logsB := filepath.Join(dir, "logs-a"), filepath.Join(dir, "logs-b")
	args := []string{"--job", "tlsjob", "--transport", "tcp", "--checkpoint", url, "--steps", "1500", "--samples", "8000", "--batch", "256",
		"--hidden", "64", "--seed", "5", "--threads", "1", "--checkpoint-every-steps", "50", "--checkpoint-keep", "0"}

	a := startJob(t, append([]string{"--workers", "3", "--log-dir", logsA, "--log-level", "info",
		"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}, args...)...)
	started := a.Until(t, "the job's start", jobtest.Kind("job_started"))
	ep, _ := started["etcd_endpoints"].(string)
	if !strings.HasPrefix(ep, "https://127.0.0.1:") {
		t.Fatalf("the job's etcd is at %q, want https", ep)
	}
	a.Until(t, "a checkpoint saved", jobtest.Kind("checkpoint_saved"))
	a.Until(t, "step 25 of 3 workers", jobtest.StepIn(3, 25))

	// Plaintext is refused: the data plane (a probe hello answered that
	// TLS is required) and etcd (a plaintext client reads nothing).
	pids := a.WorkerPids()
	addrs, err := sockowner.Listening(pids[0])
	if err != nil {
		t.Fatal(err)
	}
	told := ""
	for _, addr := range addrs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := collective.Probe(ctx, addr, nil); err != nil && strings.Contains(err.Error(), "requires mutual TLS") {
			told = addr
		}
		cancel()
	}
	if told == "" {
		t.Fatalf("no listener of worker 0 (%v) told a plaintext probe that TLS is required", addrs)
	}
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + strings.TrimPrefix(ep, "https://")}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err = plain.Get(ctx, "/phalanx/")
	cancel()
	plain.Close()
	if err == nil {
		t.Fatal("a plaintext etcd client read the job's etcd")
	}

	// phalanx status reads the job's etcd with the job's files, and is
	// refused without them.
	status := command(t, "status", "--json", "--etcd-endpoints", ep, "--job", "tlsjob", "--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key)
	if out, err := status.CombinedOutput(); err != nil || !strings.Contains(string(out), `"tlsjob"`) {
		t.Fatalf("phalanx status with the job's TLS files: %v\n%s", err, out)
	}
	if out, err := command(t, "status", "--json", "--etcd-endpoints", ep, "--job", "tlsjob").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "needs the job's TLS material") {
		t.Fatalf("phalanx status of an https etcd without TLS files: %v\n%s", err, out)
	}
	killed := a.KillWorker(t, 1, syscall.SIGKILL)
	a.Until(t, "the worker's exit", func(e jobtest.Event) bool {
		return e["event"] == "worker_exited" && jobtest.Num(e, "pid") == killed
	})
	after := a.Until(t, "a step of the two others", jobtest.StepIn(2, 1))
	a.Until(t, "a checkpoint of the two", func(e jobtest.Event) bool {
		return e["event"] == "checkpoint_saved" && jobtest.Num(e, "step") > jobtest.Num(after, "step")
	})
	for _, pid := range a.WorkerPids() {
		if pid != killed {
			jobtest.Kill(t, pid, syscall.SIGKILL)
		}
	}
	a.Cmd.Process.Kill()
	a.End()
	from := jobtest.NewestComplete(t, store)
	if from.World != 2 {
		t.Fatalf("the newest checkpoint is of %d workers, want the two survivors'", from.World)
	}

	b := startJob(t, append([]string{"--workers", "2", "--log-dir", logsB, "--log-level", "info", "--tls", "auto", "--resume"}, args...)...)
	evB := b.Finish(t)
	if ep, _ := b.Started()["etcd_endpoints"].(string); !strings.HasPrefix(ep, "https://") {
		t.Fatalf("the resumed job's etcd is at %q, want https (--tls auto)", ep)
	}
	if r := evB["checkpoint_restored"]; len(r) != 1 || jobtest.Num(r[0], "step") != int(from.Step) {
		t.Fatalf("checkpoint_restored %v, want step %d", r, from.Step)
	}
	if d := evB["done"]; len(d) != 1 {
		t.Fatalf("done events %v", d)
	}

	// No key material in any log or event: the files' keys, and the
	// ephemeral one, which --tls auto removed with its directory (its
	// path is in the spec every worker is given; the body is not).
	secrets := pkitest.KeyBody(t, f)
	var texts []string
	for _, d := range []string{logsA, logsB} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(d, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			texts = append(texts, string(b))
		}
	}
	for _, e := range append(a.Seen, b.Seen...) {
		j, _ := json.Marshal(e)
		texts = append(texts, string(j))
	}
	if len(texts) < 8 {
		t.Fatalf("only %d logs and events to read", len(texts))
	}
	for _, s := range texts {
		for _, k := range secrets {
			if strings.Contains(s, k) {
				t.Fatalf("a line of the key's PEM body is in a log or event: %q", k)
			}
		}
		if strings.Contains(s, "PRIVATE KEY") {
			t.Fatalf("a PEM private key is in a log or event")
		}
	}
	t.Logf("trained over TLS, lost worker 1 at step %d, resumed from step %d with --tls auto; %d logs and events hold no key", jobtest.Num(after, "step"), from.Step, len(texts))
}
