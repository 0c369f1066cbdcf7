package chaos

import (
	"maps"
	"testing"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
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
