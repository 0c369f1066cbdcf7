//go:build phalanx_plant

package chaos

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/plant"
)

// The parameter-server invariants proven on planted bugs (internal/plant):
// each test runs a built-in ps scenario against servers with one bug
// planted and asserts that the invariants reading the shards' accounts
// fail, naming the shard, the share and the step, from what the runtime
// reports. The same scenarios pass with no bug planted (TestPSScenarios).
// The undisturbed reference runs with the bug in its environment too;
// each bug strikes only on what the reference never does or never reads
// (a replay; a backup promoted), and each test checks that its accounts
// stayed clean.

// TestPlantedPushTwice: push-twice (a shard applies a replayed push it
// should refuse as a duplicate) in ps-ack-lost, whose promoted backup is
// sent one replay of each share: invariants 6, 2 and 3 fail, naming shard
// 0, a share, and the step that share had in flight at the primary's kill
// (the fault's own evidence).
func TestPlantedPushTwice(t *testing.T) {
	rep := runPlanted(t, plant.PushTwice, "ps-ack-lost", 1)
	inFlight := map[string]string{} // share → its step in flight at the kill
	for _, m := range regexp.MustCompile(`share (\d+)'s step (\d+)`).FindAllStringSubmatch(rep.Faults[0].HealWhat, -1) {
		inFlight[m[1]] = m[2]
	}
	if len(inFlight) != 3 {
		t.Fatalf("the fault's heal %q does not name the 3 shares' pushes in flight", rep.Faults[0].HealWhat)
	}
	twice := regexp.MustCompile(`shard 0\b.*share (\d+)'s step (\d+) applied twice`)
	for _, n := range []int{2, 3, 6} {
		v := rep.Invariants[n]
		m := twice.FindStringSubmatch(v.Evidence)
		if v.Status != "fail" || m == nil || inFlight[m[1]] != m[2] {
			t.Errorf("invariant %d: %s %q; want a failure naming shard 0 and a share's step in flight at the kill applied twice (in flight: %v)",
				n, v.Status, v.Evidence, inFlight)
		}
	}
	checkPlantedRun(t, rep)
}

// TestPlantedLoseAckedPush: lose-acked-push (every primary acknowledges
// share 1's push of step 500 without forwarding it to its backup) in
// ps-primary-kill, which kills a shard's primary at step 1000: invariants
// 6, 2 and 3 fail, naming the shard failed over, share 1 and step 500.
// The other shard's backup lacks the push too, but it is never promoted,
// so never read: no invariant names it.
func TestPlantedLoseAckedPush(t *testing.T) {
	rep := runPlanted(t, plant.LoseAckedPush, "ps-primary-kill", 1)
	f := rep.Faults[0]
	m := regexp.MustCompile(`primary of shard (\d+) of 2`).FindStringSubmatch(f.What)
	if m == nil {
		t.Fatalf("the fault's evidence %q names no shard", f.What)
	}
	if f.AtStep < 1000 {
		t.Fatalf("the primary was killed at step %d, before step 1000: the planted loss (step 500) may not have preceded it", f.AtStep)
	}
	lost := regexp.MustCompile(`shard ` + m[1] + `\b.*share 1's step 500 never applied`)
	for _, n := range []int{2, 3, 6} {
		if v := rep.Invariants[n]; v.Status != "fail" || !lost.MatchString(v.Evidence) {
			t.Errorf("invariant %d: %s %q; want a failure naming shard %s, share 1 and step 500 never applied", n, v.Status, v.Evidence, m[1])
		}
	}
	checkPlantedRun(t, rep)
}

// runPlanted runs the built-in scenario name with bug planted in every
// process the runner starts (the reference's too) and returns its report,
// which must have failed.
func runPlanted(t *testing.T, bug plant.Bug, name string, seed uint64) *Report {
	t.Helper()
	if testing.Short() {
		t.Skip("real jobs: not in -short")
	}
	t.Setenv(plant.Env, string(bug))
	sc, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{Registry: examples.Registry(), Dir: jobtest.KeptDir(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := r.Run(ctx, sc, seed)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Faults {
		t.Logf("fault %d (%s): %s; healed: %s", f.Index, f.Kind, f.What, f.HealWhat)
		if f.What == "" || f.Injected.IsZero() || f.Error != "" {
			t.Errorf("fault %d (%s) left no evidence or failed: %+v", f.Index, f.Kind, f)
		}
	}
	for _, v := range rep.Invariants {
		t.Logf("invariant %d %s: %s", v.N, v.Status, v.Evidence)
	}
	if rep.Passed {
		t.Errorf("%s passed with %s planted", name, bug)
	}
	return rep
}

// checkPlantedRun: the job finished despite the bug (the invariants, not
// a crash, caught it), and the reference's shard accounts are clean.
func checkPlantedRun(t *testing.T, rep *Report) {
	t.Helper()
	if v := rep.Invariants[1]; v.Status != "pass" {
		t.Errorf("invariant 1: %s %q: the job should finish with the bug planted", v.Status, v.Evidence)
	}
	rf := psFactsOf(rep.RefEvents)
	if v := psCheckPushes(rf, rf); v.Status != "pass" {
		t.Errorf("the undisturbed reference's shard accounts: %s", v.Evidence)
	}
}
