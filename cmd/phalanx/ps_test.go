package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"syscall"
	"testing"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/examples/sparselr"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/ps"
	"github.com/phalanx-rt/phalanx/ps/cluster"
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

// resumeAUCTolerance bounds how far the AUC of a job resumed from a
// checkpoint (into another number of shards) may be from the same job run
// uninterrupted: bsp averages the same gradients either way, so only the
// order of float sums differs.
const resumeAUCTolerance = 0.002

// TestPSResumeReshard: a sparse-lr job on 2 shards checkpoints every 1,000
// steps and at its end (one epoch); a second run, on 3 servers and 3 shards,
// resumes from the newest checkpoint that verifies (the last one is corrupted
// on purpose, so the one of step 1,000) and trains to the end of the second
// epoch at the AUC of the same job run uninterrupted (run here too), within
// resumeAUCTolerance.
func TestPSResumeReshard(t *testing.T) {
	dir := t.TempDir()
	second := []string{"--example", "sparse-lr", "--workers", "2", "--ps-servers", "3", "--ps-shards", "3", "--epochs", "2"}
	whole := startJob(t, second...).Finish(t)["done"][0]
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
	ev := startJob(t, append(second, "--checkpoint", dir)...).Finish(t)
	r := ev["restored"]
	if len(r) != 1 || r[0]["step"].(float64) != 1000 || r[0]["from_shards"].(float64) != 2 || r[0]["shards"].(float64) != 3 {
		t.Fatalf("restored %v, want step 1000 from 2 shards into 3 (the last checkpoint is corrupt)", r)
	}
	done := ev["done"][0]
	if done["steps"].(float64) != 3906 || done["steps"] != whole["steps"] {
		t.Fatalf("done %v, uninterrupted %v: want 3906 steps", done, whole)
	}
	if d := math.Abs(done["auc"].(float64) - whole["auc"].(float64)); d > resumeAUCTolerance {
		t.Errorf("AUC %.5f resumed, %.5f uninterrupted: %.5f apart, want at most %v", done["auc"], whole["auc"], d, resumeAUCTolerance)
	}
	for _, a := range ev["ps_pushes"] {
		if a["exactly_once"] != true {
			t.Errorf("shard account %v: want every step from the checkpoint's on applied once", a)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ps-000000001000", "manifest.json")); err != nil {
		t.Fatalf("the checkpoint resumed from is gone: %v", err)
	}
	t.Logf("resumed at step 1000 into 3 shards: AUC %.5f, uninterrupted %.5f (the teacher's %.4f)", done["auc"], whole["auc"], done["bayes_auc"])
}

// TestPSCheckpointHoldsSteps: under bsp the checkpoint of step N holds
// exactly the first N steps: a 2-epoch job's checkpoint of step N (the end
// of its first epoch) has bitwise the rows (values and Adagrad state) of the
// final checkpoint of the same job stopped after 1 epoch. Two workers, so
// each clock's sum of gradients is the same in either order; a row only one
// of them holds must be untrained (created by a pull of step N+1).
func TestPSCheckpointHoldsSteps(t *testing.T) {
	args := []string{"--example", "sparse-lr", "--workers", "2", "--ps-servers", "2", "--sync", "bsp", "--examples", "20000",
		"--held-out", "2000", "--ids", "20000"}
	const n = 78 // 20,000 examples / 2 workers / 128 a step
	longer, stopped := t.TempDir(), t.TempDir()
	a := startJob(t, append(args, "--epochs", "2", "--checkpoint", longer, "--checkpoint-every-steps", fmt.Sprint(n))...).Finish(t)
	b := startJob(t, append(args, "--epochs", "1", "--checkpoint", stopped)...).Finish(t)
	if a["done"][0]["steps"].(float64) != 2*n || b["done"][0]["steps"].(float64) != n {
		t.Fatalf("steps %v and %v, want %d and %d", a["done"][0]["steps"], b["done"][0]["steps"], 2*n, n)
	}
	rows := func(dir string) map[uint64][]float32 {
		t.Helper()
		store, err := checkpoint.OpenURL(context.Background(), dir, checkpoint.Credentials{})
		if err != nil {
			t.Fatal(err)
		}
		m, snaps, err := cluster.Load(context.Background(), store, cluster.Prefix(n))
		if err != nil {
			t.Fatal(err)
		}
		if m.Step != n {
			t.Fatalf("%s: the checkpoint of step %d", dir, m.Step)
		}
		out := map[uint64][]float32{}
		for _, sn := range snaps {
			for i, k := range sn.Keys {
				out[k] = sn.Rows[i*sn.Stride : (i+1)*sn.Stride]
			}
		}
		return out
	}
	ra, rb := rows(longer), rows(stopped)
	opt, err := ps.ParseOptimizer("adagrad")
	if err != nil {
		t.Fatal(err)
	}
	fresh := ps.NewRows(sparselr.Spec(20000, opt, 0.2))
	untrained := func(k uint64, row []float32) bool {
		fresh.Pull([]uint64{k}, make([]float32, 1))
		var init []float32
		fresh.Each(func(key uint64, r []float32) {
			if key == k {
				init = r
			}
		})
		return slices.Equal(init, row)
	}
	same, extra := 0, 0
	for k, x := range ra {
		y, ok := rb[k]
		switch {
		case ok && !slices.Equal(x, y):
			t.Fatalf("key %d: %v in the 2-epoch job's checkpoint of step %d, %v in the job stopped there", k, x, n, y)
		case ok:
			same++
		case !untrained(k, x):
			t.Fatalf("key %d: %v only in the 2-epoch job's checkpoint of step %d, and trained", k, x, n)
		default:
			extra++
		}
	}
	for k, y := range rb {
		if _, ok := ra[k]; !ok && !untrained(k, y) {
			t.Fatalf("key %d: %v only in the stopped job's checkpoint, and trained", k, y)
		}
	}
	if same == 0 {
		t.Fatal("no rows in common")
	}
	t.Logf("%d rows bitwise equal; %d untrained rows only in the longer job's checkpoint", same, extra)
}

// psKillArgs: 4 workers, so a lost one's share goes to one of 3.
var psKillArgs = []string{"--example", "sparse-lr", "--workers", "4", "--ps-servers", "2", "--ps-replicas", "1",
	"--lease-ttl", "5s", "--report-every", "100"}

// TestPSWorkerKilled: SIGKILL parameter-server worker 1 (of 4) by pid in
// the middle of the first epoch. Its lease expires, another worker claims
// its share and trains it from where the shards say it stopped, and the job
// exits 0 with every step of every share applied exactly once (ps_pushes:
// on every shard under bsp; under asp a step pushes only the shards its
// keys fall on, so on the shard of the bias row, which every step touches),
// hence every example of each epoch trained exactly once (the share and
// step of sparse-lr name the examples), and an AUC within tolerance of the
// undisturbed run's. Under bsp a share's steps are trained on the same
// parameters either way (a step's pull sees every earlier step), so only
// the order of float sums differs: 0.002. Under asp two undisturbed runs
// already differ (0.7824 and 0.7831 measured): 0.003.
func TestPSWorkerKilled(t *testing.T) {
	for _, tc := range []struct {
		mode      string
		tolerance float64
	}{{"bsp", 0.002}, {"asp", 0.003}} {
		t.Run(tc.mode, func(t *testing.T) { testPSWorkerKilled(t, tc.mode, tc.tolerance) })
	}
}

func testPSWorkerKilled(t *testing.T, mode string, tolerance float64) {
	args := append(slices.Clone(psKillArgs), "--sync", mode)
	clean := startJob(t, args...).Finish(t)
	j := startJob(t, args...)
	var victim int
	j.Until(t, "worker 1 started", func(e jobtest.Event) bool {
		if e["event"] == "worker_started" && e["role"] == "ps-worker" && jobtest.Num(e, "worker") == 1 {
			victim = jobtest.Num(e, "pid")
			return true
		}
		return false
	})
	j.Until(t, "step 1000", func(e jobtest.Event) bool { return e["event"] == "step" && e["step"].(float64) >= 1000 })
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ev := j.Finish(t)
	lost := ev["ps_worker_lost"]
	if len(lost) != 1 || jobtest.Num(lost[0], "worker") != 1 || jobtest.Num(lost[0], "pid") != victim {
		t.Fatalf("workers lost %v, want worker 1 (pid %d)", lost, victim)
	}
	steps := int(ev["done"][0]["steps"].(float64))
	const workers, batch, examples = 4, 64, 500000
	perEpoch := examples / workers / batch
	if steps != 2*perEpoch {
		t.Fatalf("%d steps, want %d", steps, 2*perEpoch)
	}
	// Who trained what: share 1 from its own start, then adopted.
	var adopted jobtest.Event
	for _, c := range ev["ps_share"] {
		if c["reason"] == "adopted" {
			if adopted != nil {
				t.Fatalf("shares adopted twice: %v", ev["ps_share"])
			}
			adopted = c
		}
	}
	if adopted == nil || jobtest.Num(adopted, "share") != 1 || jobtest.Num(adopted, "worker") == 1 {
		t.Fatalf("claims %v, want share 1 adopted by another worker", ev["ps_share"])
	}
	// Share 0's step 1000 pulled after every share's step 999 was applied
	// (bsp): share 1 died after that. Under asp it is at its own pace.
	if from, first := jobtest.Num(adopted, "from"), map[string]int{"bsp": 999, "asp": 1}[mode]; from < first || from >= perEpoch {
		t.Errorf("share 1 resumed after step %d, want within the first epoch, from step %d on", from, first)
	}
	doneBy := map[int]int{}
	for _, d := range ev["ps_share_done"] {
		doneBy[jobtest.Num(d, "share")]++
	}
	if len(doneBy) != workers {
		t.Errorf("shares done %v, want every one of %d", doneBy, workers)
	}
	// Every step of every share applied once on every shard: ids (steps)
	// only increase, so applied == last - base means steps base+1..last,
	// each once. Each such step names its examples: sparse-lr's share s
	// trains, at step k (from 0) of an epoch, examples
	// s*examples/workers + k*batch + 0..batch-1.
	pushes := ev["ps_pushes"]
	if len(pushes) != 2 {
		t.Fatalf("push accounts %v, want one per shard", pushes)
	}
	opt, err := ps.ParseOptimizer("adagrad")
	if err != nil {
		t.Fatal(err)
	}
	spec := sparselr.Spec(1000000, opt, 0.2)
	part, err := ps.NewPartitioner(ps.PartitionHash, 2, &spec)
	if err != nil {
		t.Fatal(err)
	}
	biasShard := part.Shard(1000000) // sparse-lr's bias row
	for _, a := range pushes {
		if mode == "asp" && jobtest.Num(a, "shard") != biasShard {
			for _, p := range a["pushes"].([]any) {
				if c := p.(jobtest.Event); jobtest.Num(c, "applied") > jobtest.Num(c, "last")-jobtest.Num(c, "base") {
					t.Errorf("shard %v's account of share %v: %v: a step applied twice", a["shard"], c["share"], c)
				}
			}
			continue
		}
		if want := map[string]any{"bsp": true, "asp": nil}[mode]; a["exactly_once"] != want {
			t.Errorf("shard %v: exactly_once %v, want %v", a["shard"], a["exactly_once"], want)
		}
		seen := [2][]int{make([]int, examples), make([]int, examples)} // by epoch
		for _, p := range a["pushes"].([]any) {
			c := p.(jobtest.Event)
			share, base, last, applied := jobtest.Num(c, "share"), jobtest.Num(c, "base"), jobtest.Num(c, "last"), jobtest.Num(c, "applied")
			if applied != last-base {
				t.Fatalf("shard %v's account of share %d: %v: a gap or a step applied twice", a["shard"], share, c)
			}
			for step := base + 1; step <= last; step++ {
				epoch, k := (step-1)/perEpoch, (step-1)%perEpoch
				for i := range batch {
					seen[epoch][share*examples/workers+k*batch+i]++
				}
			}
		}
		for epoch, counts := range seen {
			trained := 0
			for i, c := range counts {
				if c > 1 {
					t.Fatalf("shard %v, epoch %d: example %d trained %d times", a["shard"], epoch, i, c)
				}
				trained += c
			}
			if want := workers * perEpoch * batch; trained != want {
				t.Errorf("shard %v, epoch %d: %d examples trained, want %d (each share's %d steps of %d)", a["shard"], epoch, trained, want, perEpoch, batch)
			}
		}
	}
	a, b := clean["done"][0], ev["done"][0]
	if got, want := shardAccounts(t, b), shardAccounts(t, a); !reflect.DeepEqual(got, want) {
		t.Errorf("shard accounts after the kill %v, undisturbed %v", got, want)
	}
	if d := math.Abs(a["auc"].(float64) - b["auc"].(float64)); d > tolerance {
		t.Errorf("AUC %.5f after the kill, %.5f undisturbed: %.5f apart, want at most %v", b["auc"], a["auc"], d, tolerance)
	}
	t.Logf("share 1 adopted by worker %v at step %v (replayed to %v); AUC %.5f, undisturbed %.5f (the teacher's %.4f)",
		adopted["worker"], adopted["from"], adopted["replayed_to"], b["auc"], a["auc"], b["bayes_auc"])
}
