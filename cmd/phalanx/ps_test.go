package main

import (
	"fmt"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
)

var psJobArgs = []string{"--example", "sparse-lr", "--workers", "2", "--ps-servers", "2", "--ps-replicas", "1", "--sync", "bsp",
	"--lease-ttl", "2s", "--report-every", "50"}

// shardAccounts is the done event's account of each shard: its clock and
// the pushes it applied from each worker.
func shardAccounts(t *testing.T, done jobtest.Event) []any {
	t.Helper()
	shards, ok := done["shards"].([]any)
	if !ok || len(shards) == 0 {
		t.Fatalf("done %v without the shards' accounts", done)
	}
	steps := done["steps"].(float64)
	for _, s := range shards {
		m := s.(jobtest.Event)
		if m["clock"].(float64) != steps {
			t.Errorf("shard %v closed %v clocks, want %v", m["shard"], m["clock"], steps)
		}
		for w, p := range m["pushes"].([]any) {
			if p.(float64) != steps {
				t.Errorf("shard %v applied %v pushes of worker %d, want %v (every acknowledged one, once)", m["shard"], p, w, steps)
			}
		}
		delete(m, "rows") // rows touched depend on nothing lost, but not on the order
	}
	return shards
}

// TestPSPrimaryKilled: SIGKILL the parameter server that is shard 0's
// primary mid-training (one backup per shard): its backup takes over
// through the coordinator once the lease expires (ps_failover), the
// workers resend what was not acknowledged, and the job ends with every
// push applied exactly once on every shard (the same account as an
// undisturbed run) and an AUC within 0.005 of it.
func TestPSPrimaryKilled(t *testing.T) {
	clean := startJob(t, psJobArgs...).Finish(t)
	j := startJob(t, psJobArgs...)
	m := j.Until(t, "the first shard map", func(e jobtest.Event) bool { return e["event"] == "ps_shard_map" })
	var victim int
	var victimID string
	for _, s := range m["shards"].([]any) {
		if p := s.(jobtest.Event); p["shard"].(float64) == 0 {
			victimID = p["primary"].(string)
		}
	}
	for _, s := range m["servers"].([]any) {
		if p := s.(jobtest.Event); p["id"] == victimID {
			victim = int(p["pid"].(float64))
		}
	}
	if victim == 0 {
		t.Fatalf("no pid for shard 0's primary %q in %v", victimID, m)
	}
	j.Until(t, "step 500", func(e jobtest.Event) bool { return e["event"] == "step" && e["step"].(float64) >= 500 })
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ev := j.Finish(t)
	fo := ev["ps_failover"]
	if len(fo) == 0 || fo[0]["old"] != victimID || fo[0]["shard"].(float64) != 0 {
		t.Fatalf("failovers %v, want shard 0 taken from %s", fo, victimID)
	}
	a, b := clean["done"][0], ev["done"][0]
	if got, want := shardAccounts(t, b), shardAccounts(t, a); !reflect.DeepEqual(got, want) {
		t.Errorf("shard accounts after the kill %v, undisturbed %v", got, want)
	}
	if d := math.Abs(a["auc"].(float64) - b["auc"].(float64)); d > 0.005 {
		t.Errorf("AUC %.4f after the kill, %.4f undisturbed: %.4f apart", b["auc"], a["auc"], d)
	}
	if b["auc"].(float64) < 0.75 {
		t.Errorf("AUC %.4f, want at least 0.75 (the teacher's %.4f)", b["auc"], b["bayes_auc"])
	}
	t.Logf("AUC %.4f (undisturbed %.4f, the teacher's %.4f); failover %v", b["auc"], a["auc"], b["bayes_auc"], fo[0])
}

// TestPSResumeReshard: a sparse-lr job on 2 shards checkpoints every 1,000
// steps and at its end (one epoch); a second run, on 3 servers and 3 shards,
// resumes from the newest checkpoint that verifies (the last one is corrupted
// on purpose, so the one of step 1,000) and trains to the end of the second
// epoch at the AUC of a run never interrupted.
func TestPSResumeReshard(t *testing.T) {
	dir := t.TempDir()
	first := startJob(t, "--example", "sparse-lr", "--workers", "2", "--ps-servers", "2", "--epochs", "1",
		"--checkpoint", dir, "--checkpoint-every-steps", "1000").Finish(t)
	saved := first["checkpoint_saved"]
	if len(saved) != 2 || saved[0]["step"].(float64) != 1000 || saved[1]["step"] != first["done"][0]["steps"] {
		t.Fatalf("checkpoints %v, want steps 1000 and the last", saved)
	}
	last := filepath.Join(dir, fmt.Sprintf("ps-%012d", int(saved[1]["step"].(float64))), "shard-0001.snap")
	b, err := os.ReadFile(last)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.Chmod(last, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(last, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ev := startJob(t, "--example", "sparse-lr", "--workers", "2", "--ps-servers", "3", "--ps-shards", "3", "--epochs", "2",
		"--checkpoint", dir).Finish(t)
	r := ev["restored"]
	if len(r) != 1 || r[0]["step"].(float64) != 1000 || r[0]["from_shards"].(float64) != 2 || r[0]["shards"].(float64) != 3 {
		t.Fatalf("restored %v, want step 1000 from 2 shards into 3 (the last checkpoint is corrupt)", r)
	}
	done := ev["done"][0]
	if done["steps"].(float64) != 3906 || done["auc"].(float64) < 0.75 {
		t.Fatalf("done %v", done)
	}
	if _, err := os.Stat(filepath.Join(dir, "ps-000000001000", "manifest.json")); err != nil {
		t.Fatalf("the checkpoint resumed from is gone: %v", err)
	}
	t.Logf("resumed at step 1000 into 3 shards: AUC %.4f (the teacher's %.4f)", done["auc"], done["bayes_auc"])
}
