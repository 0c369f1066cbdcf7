package chaos

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/kindtest"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// TestRunnerConfigureREADME: the README's Runner, whose Configure writes a
// model option, gets a launch with that option, whether the scenario's job
// names options or not, and the scenario's options are left as they were
// (a Configure once wrote into a nil map and panicked).
func TestRunnerConfigureREADME(t *testing.T) {
	r := &Runner{Registry: examples.Registry(), Configure: func(lc *phalanx.LaunchConfig) { lc.ModelOptions["data"] = "/data/train" }}
	for _, tc := range []struct {
		name    string
		options map[string]string
		want    map[string]string
	}{
		{"no options", nil, map[string]string{"data": "/data/train"}},
		{"options of its own", map[string]string{"samples": "6000"}, map[string]string{"samples": "6000", "data": "/data/train"}},
		{"the option Configure overrides", map[string]string{"data": "/data/small"}, map[string]string{"data": "/data/train"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := Scenario{Name: "mine", Job: JobSpec{Model: "my-model", Workers: 4, Steps: 500, Options: maps.Clone(tc.options)},
				Faults: []FaultSpec{{Kind: "sigkill", Target: "random", Trigger: Trigger{Step: 50, StepMax: 400}}}}
			var lc phalanx.LaunchConfig
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("the launch's Configure, as the README writes it, panicked: %v", p)
					}
				}()
				lc = r.launchConfig(&sc, "chaos-mine-1-1", 4, "", t.TempDir(), nil)
			}()
			if !maps.Equal(lc.ModelOptions, tc.want) {
				t.Errorf("the launch's model options are %v, want %v", lc.ModelOptions, tc.want)
			}
			if !maps.Equal(sc.Job.Options, tc.options) {
				t.Errorf("Configure changed the scenario's options to %v, from %v", sc.Job.Options, tc.options)
			}
		})
	}
}

// TestRunnerConfigureREADMERun runs the README's example against a real
// job: a scenario with no options of its own, a Configure that writes the
// model's options into the launch (the built-in mlp's: samples and hidden,
// for the README's data, which mlp would read), a SIGKILL of a random
// worker. Every invariant holds, and invariant 2's fingerprints prove that
// every launch's workers trained on the 6000 samples Configure gave them.
func TestRunnerConfigureREADMERun(t *testing.T) {
	if testing.Short() {
		t.Skip("real jobs: not in -short")
	}
	r := &Runner{Registry: examples.Registry(), Dir: jobtest.KeptDir(t), Configure: func(lc *phalanx.LaunchConfig) {
		lc.ModelOptions["samples"] = "6000"
		lc.ModelOptions["hidden"] = "32"
	}}
	// The README's, with the fault placed early as the built-ins' are: a
	// crowded machine's events reach the harness 50 steps late and more.
	sc := Scenario{Name: "mine", Job: JobSpec{Model: "mlp", Workers: 4, Steps: 500},
		Faults: []FaultSpec{{Kind: "sigkill", Target: "random", Trigger: Trigger{Step: 50, StepMax: 100}}}}
	rep := runAndCheck(t, r, sc, 1)
	if !rep.Passed {
		t.Errorf("the run failed; kept in %s", rep.Dir)
	}
	if ev := rep.Invariants[2].Evidence; !strings.Contains(ev, "of the 6000 indices") {
		t.Errorf("invariant 2 did not check the 6000 samples Configure set: %s", ev)
	}
	if sc.Job.Options != nil {
		t.Errorf("Configure wrote into the scenario's options: %v", sc.Job.Options)
	}
}

// TestRunnerThirdKind runs a sigkill scenario against a job of a kind the
// harness does not know (internal/kindtest: workers that run barriers on an
// elastic ring), registered in the runner's registry alone: the fault
// fires and kills its target, the ring closes without it and the job
// finishes, nothing is left behind, and the invariants the kind says its
// events leave unchecked (samples, parameters) are n/a, every other
// checked.
func TestRunnerThirdKind(t *testing.T) {
	if testing.Short() {
		t.Skip("real jobs: not in -short")
	}
	r := &Runner{Registry: kindtest.Registry(examples.Registry()), Dir: jobtest.KeptDir(t)}
	sc := Scenario{Name: "barrier-kill", Job: JobSpec{Kind: "barrier", Model: "barriers", Workers: 3, Steps: 20000},
		Faults: []FaultSpec{{Kind: "sigkill", Target: "random", Trigger: Trigger{Step: 100, StepMax: 200}}}}
	rep := runAndCheck(t, r, sc, 1)
	if !rep.Passed {
		t.Errorf("the run failed; kept in %s", rep.Dir)
	}
	for _, v := range rep.Invariants {
		want := "pass"
		switch v.N {
		case 2, 3, 4, 5, 6:
			want = "n/a"
		}
		if v.Status != want {
			t.Errorf("invariant %d (%s): %s (%s), want %s", v.N, v.Name, v.Status, v.Evidence, want)
		}
	}
}

// TestRunnerRefusesAMismatchedKind: a scenario naming a kind its model is
// not of is refused before any job runs.
func TestRunnerRefusesAMismatchedKind(t *testing.T) {
	r := &Runner{Registry: kindtest.Registry(examples.Registry()), Dir: t.TempDir()}
	sc := Scenario{Name: "wrong", Job: JobSpec{Kind: "barrier", Model: "mlp", Workers: 2, Steps: 10}}
	if _, err := r.Run(testwait.Context(t, time.Minute), sc, 1); !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), `model mlp is of kind "ring"`) {
		t.Fatalf("Run: %v, want ErrScenario naming the model's kind", err)
	}
}
