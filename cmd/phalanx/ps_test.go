package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/chaos"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/examples/sparselr"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/ps"
	"github.com/phalanx-rt/phalanx/ps/cluster"
)

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
		ctx := testContext(t, storeWait)
		store, err := checkpoint.OpenURL(ctx, dir, checkpoint.Credentials{})
		if err != nil {
			t.Fatal(err)
		}
		m, snaps, err := cluster.Load(ctx, store, cluster.Prefix(n))
		if err != nil {
			t.Fatalf("loading the checkpoint of step %d from %s: %v", n, dir, err)
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

// TestPSWorkerKilled: chaos's ps-worker-kill (SIGKILL of the
// parameter-server worker training a share, mid-training, by pid) under
// bsp and under asp. Every invariant holds: the job ends at its last step,
// each share is finished once and reaches it (bsp: every example of every
// epoch trained once on every shard), no share's step is applied twice on
// any shard (bsp: exactly once), the killed worker's shares are adopted,
// nothing is left behind, and the AUC is within tolerance of the
// undisturbed run's: under bsp a share's steps are trained on the same
// parameters either way, so only the order of float sums differs (0.002,
// the harness's); under asp two undisturbed runs already differ (0.7824
// and 0.7831 measured): 0.003. Besides: the loss is detected once, for the
// killed pid; only its shares are adopted, each once, by another worker,
// mid-job (from a step in 1..N-1); every shard closes every clock with
// every share's last push, as undisturbed; and on the shard of the bias
// row, which every step touches (under asp the only shard where this
// holds), every share's steps 1..N are applied exactly once (so, as sparse-lr's share s trains
// examples s*examples/workers + k*batch + 0..batch-1 at step k of an
// epoch, every example of every epoch once).
func TestPSWorkerKilled(t *testing.T) {
	ci, err := chaos.Lookup("ps-worker-kill") // bsp: CI's job, about 8s of training
	if err != nil {
		t.Fatal(err)
	}
	// asp on the job those 0.003 were measured on: a share stalled for a
	// lease costs a small job's AUC more (0.0030 seen on CI's).
	asp := chaos.Scenario{Name: "ps-worker-kill-asp", Tolerance: 0.003, Job: chaos.JobSpec{Kind: "ps",
		Options: map[string]string{"ids": "1000000", "examples": "500000", "epochs": "2", "ps-servers": "2", "ps-replicas": "1",
			"consistency": "asp", "report-every": "100"},
		Workers: 4, Steps: 3906, Batch: 256, LeaseTTL: chaos.Duration(5 * time.Second)},
		Faults: []chaos.FaultSpec{{Kind: "ps-worker-kill", Trigger: chaos.Trigger{Step: 1000}}}}
	for _, sc := range []chaos.Scenario{ci, asp} {
		t.Run(sc.Job.Options["consistency"], func(t *testing.T) { testPSWorkerKilled(t, sc) })
	}
}

func testPSWorkerKilled(t *testing.T, sc chaos.Scenario) {
	// The first seed that kills share 0's worker (every share is in
	// training then): share 0's worker reports the steps, so its adopter's
	// steps time the recovery (under asp the others may have finished
	// their own shares by then).
	seed := uint64(1)
	for sc.Plan(seed)[0].Pick%uint64(sc.Job.Workers) != 0 {
		seed++
	}
	rep, tap := runScenario(t, sc, seed)
	victim, ev := faultPid(t, rep.Faults[0]), tap.run
	if lost := ev["ps_worker_lost"]; len(lost) != 1 || jobtest.Num(lost[0], "pid") != victim {
		t.Fatalf("workers lost %v, want pid %d", lost, victim)
	}
	steps := jobtest.Num(ev["done"][0], "steps")
	adopted, claimer := map[int]int{}, map[int]int{}
	for _, c := range ev["ps_share"] {
		share, pid := jobtest.Num(c, "share"), jobtest.Num(c, "pid")
		if c["reason"] != "adopted" {
			claimer[share] = pid
			continue
		}
		if adopted[share]++; claimer[share] != victim || pid == victim || jobtest.Num(c, "from") < 1 || jobtest.Num(c, "from") >= steps {
			t.Errorf("share claim %v: want only pid %d's shares adopted, by another worker, from a step in 1..%d", c, victim, steps-1)
		}
	}
	for share, n := range adopted {
		if n != 1 {
			t.Errorf("share %d adopted %d times: %v", share, n, ev["ps_share"])
		}
	}
	if got, want := shardAccounts(t, ev["done"][0]), shardAccounts(t, tap.ref["done"][0]); !reflect.DeepEqual(got, want) {
		t.Errorf("shard accounts after the kill %v, undisturbed %v", got, want)
	}
	opt, err := ps.ParseOptimizer("adagrad")
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := strconv.Atoi(sc.Job.Options["ids"])
	spec := sparselr.Spec(ids, opt, 0.2)
	part, err := ps.NewPartitioner(ps.PartitionHash, 2, &spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range ev["ps_pushes"] {
		if jobtest.Num(a, "shard") != part.Shard(uint64(ids)) { // sparse-lr's bias row
			continue // invariant 6: no step applied twice
		}
		for _, p := range a["pushes"].([]any) {
			if c := p.(jobtest.Event); jobtest.Num(c, "base") != 0 || jobtest.Num(c, "last") != steps || jobtest.Num(c, "applied") != steps {
				t.Errorf("the bias row's shard %v: account of share %v %v, want steps 1..%d each applied once", a["shard"], c["share"], c, steps)
			}
		}
	}
	t.Logf("%s; AUC %.5f, undisturbed %.5f", rep.Invariants[2].Evidence, rep.Accuracy, rep.RefAccuracy)
}
