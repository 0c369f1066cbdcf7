package chaos

import (
	"regexp"
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
)

// TestUploadScenarios runs the scenarios triggered during a checkpoint
// upload against real jobs checkpointing to a real MinIO: each fault
// lands while a worker's PUT of a checkpoint object is held at the gate,
// and every invariant holds.
func TestUploadScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("real jobs: not in -short")
	}
	miniotest.RequireBinary(t)
	r := &Runner{Registry: examples.Registry(), Dir: jobtest.KeptDir(t)}
	held := `, during the upload of /phalanx-chaos/checkpoints/\S+ \(held at the gate\)$`
	for _, tc := range []struct {
		name string
		what *regexp.Regexp
	}{
		{"minio-stop-mid-upload", regexp.MustCompile(`^SIGKILL to MinIO \(pid \d+\).*` + held)},
		{"kill-mid-upload", regexp.MustCompile(`^SIGKILL .*` + held)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := Lookup(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			rep := runAndCheck(t, r, sc, 1)
			f := rep.Faults[0]
			t.Logf("fault 0 at step %d: %s; healed: %s", f.AtStep, f.What, f.HealWhat)
			if !tc.what.MatchString(f.What) {
				t.Errorf("fault 0's evidence %q does not match %v", f.What, tc.what)
			}
			if f.AtStep < 20 {
				t.Errorf("fault 0 fired at step %d, before its trigger's step 20", f.AtStep)
			}
			if tc.name == "minio-stop-mid-upload" && !strings.Contains(f.HealWhat, "MinIO restarted") {
				t.Errorf("MinIO was not restarted: %q", f.HealWhat)
			}
			if !rep.Passed {
				t.Errorf("the run failed; kept in %s", rep.Dir)
			}
		})
	}
}
