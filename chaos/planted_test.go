//go:build phalanx_plant

package chaos

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/plant"
)

// TestPlanted proves the invariants: each case runs a real scenario
// against a runtime broken on purpose (internal/plant, compiled into this
// test binary by the build tag phalanx_plant, switched on in this process
// and its workers by the environment) and asserts that the invariant
// meant to catch the bug fails, with evidence naming where it struck.
// Every invariant 0..8 is caught at least once here (6 in
// planted_ps_test.go).
func TestPlanted(t *testing.T) {
	withCheckpoints := func(s *Scenario) { s.Job.CheckpointEvery = 20 }
	// One runner per job, its undisturbed reference run before any bug is
	// planted: the reference is the correct runtime's, and is run once.
	dir := t.TempDir()
	t.Cleanup(func() { sweepPlanted(t, dir) })
	runners := map[string]*Runner{}
	for _, tc := range []struct {
		bug      plant.Bug
		scenario string
		edit     func(*Scenario)
		// fails: the invariant that must fail, and what its evidence must say.
		fails    int
		evidence string
	}{
		{plant.SkipSample, "stop-cont", nil, 2, `step 40 .*: rank 1's sample \d+ was not trained`},
		{plant.DupSample, "stop-cont", nil, 2, `step 40 .*: rank 1 trained sample \d+ twice and sample \d+ never`},
		{plant.SamplerDup, "kill-random", nil, 2, `epoch 1 \(steps up to 94\): .*: (index \d+ trained twice and index \d+ never|as many samples as indices, but not each index once: one trained twice and one never)`},
		{plant.HybridUnrecorded, "hybrid-stop", nil, 2, `step \d+ \(generation \d+, world 4, 4 participants\): .*: \d+ samples lost, none recorded as dropped`},
		{plant.ShortJob, "stop-cont", nil, 1, `ended at step 399, want 400`},
		{plant.ParamDrift, "garbage", nil, 3, `parameters_identical=false: rank 1's parameters have CRC32C [0-9a-f]{8}, rank 0's`},
		{plant.ForgetMomentum, "corrupt-resume", nil, 4, `bitwise: parameters CRC32C [0-9a-f]{8}, the undisturbed run's`},
		{plant.CorruptObject, "stop-cont", withCheckpoints, 5, `step-0*40-\S+: .*shard-00000-of-00003`},
		{plant.ChangeAfterSave, "stop-cont", withCheckpoints, 5, `step-0*40-\S+ changed after it was saved`},
		{plant.LeakProcess, "stop-cont", nil, 7, `process \d+ \(sleep\) of the job's still runs`},
		{plant.LeakPort, "stop-cont", nil, 7, `port 127\.0\.0\.1:\d+ still accepts connections`},
		{plant.LeakShm, "stop-cont", nil, 7, `shared-memory file /dev/shm/phalanx-[0-9a-f]{16}-g\d+-[rp]\S+ of launch chaos-stop-cont-1-1`},
		{plant.FaultNoop, "kill-random", nil, 0, `fault 0 \(sigkill\)(: SIGKILL to rank \d \(pid \d+\): the signal had no effect| had no effect: its target, rank \d \(pid \d+\), ended with "exit 0", not killed)`},
		{plant.SlowRecovery, "kill-random", func(s *Scenario) { s.RecoveryBound = Duration(2 * time.Second) }, 8, `fault 0 \(sigkill\): [3-9]\.\d\ds, over the bound 2s`},
	} {
		t.Run(string(tc.bug), func(t *testing.T) {
			sc, err := Lookup(tc.scenario)
			if err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				tc.edit(&sc)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			key, _ := json.Marshal(sc.Job)
			r := runners[string(key)]
			if r == nil {
				r = &Runner{Registry: examples.Registry(), Dir: dir}
				runners[string(key)] = r
			}
			if _, err := r.Reference(ctx, &sc); err != nil {
				t.Fatal(err)
			}
			t.Setenv(plant.Env, string(tc.bug)) // in this process and every one it starts from here on
			t.Cleanup(func() { sweepPlanted(t, dir) })
			rep, err := r.Run(ctx, sc, 1)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { removeShm(rep) })
			v := rep.Invariants[tc.fails]
			for _, w := range rep.Invariants {
				t.Logf("invariant %d %s: %s", w.N, w.Status, w.Evidence)
			}
			if rep.Passed || v.Status != "fail" {
				t.Fatalf("with %s planted, invariant %d (%s) did not fail: %s %s", tc.bug, tc.fails, v.Name, v.Status, v.Evidence)
			}
			if !regexp.MustCompile(tc.evidence).MatchString(v.Evidence) {
				t.Errorf("invariant %d failed, but its evidence %q does not match %q", tc.fails, v.Evidence, tc.evidence)
			}
		})
	}
}

// sweepPlanted kills what a planted leak left running: every process
// whose mark is a run of the test's runner (its directory).
func sweepPlanted(t *testing.T, dir string) {
	procs, err := processesMarked(func(m string) bool { return strings.HasPrefix(m, dir+string(filepath.Separator)) })
	if err != nil {
		t.Error(err)
	}
	for _, p := range procs {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// removeShm removes the shared-memory files a planted leak left of the
// run's and its reference's launches.
func removeShm(rep *Report) {
	var jobs []string
	for _, e := range append(append([]Event(nil), rep.Events...), rep.RefEvents...) {
		if j, ok := e.Fields["job"].(string); ok && e.Kind == "job_started" {
			jobs = append(jobs, j)
		}
	}
	ents, _ := os.ReadDir(shmDir)
	for _, e := range ents {
		for _, j := range jobs {
			if collective.ShmSegmentOf(e.Name(), j) {
				os.Remove(filepath.Join(shmDir, e.Name()))
			}
		}
	}
}
