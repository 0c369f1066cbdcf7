package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sampleReport is a run of two faults with a resumed launch, as a report
// holds it.
func sampleReport() *Report {
	t0 := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	r := &Report{Scenario: "sample", Description: "a SIGSTOP healed, then a SIGKILL", Seed: 3, Started: t0, DurationS: 12,
		Launches: 1, Step: 100, Accuracy: 0.93, RefAccuracy: 0.931, Passed: false, RecoveryMaxS: 0.4, RecoveryBoundS: 60}
	for s := int64(1); s <= 100; s++ {
		world := int64(3)
		if s > 60 {
			world = 2
		}
		r.Steps = append(r.Steps, StepPoint{T: float64(s) * 0.11, Step: s, Loss: 2.3 / float64(s), World: world, Generation: 1 + s/61, Launch: 1})
	}
	r.Generations = []GenPoint{{T: 0.05, Generation: 1, World: 3, Reason: "rendezvous"}, {T: 6.8, Generation: 2, World: 2, Reason: "rank 1 lost"}}
	r.Faults = []*FaultRecord{
		{Planned: Planned{Index: 0, Kind: "sigstop"}, AtStep: 30, Injected: t0.Add(3300 * time.Millisecond), Healed: t0.Add(4800 * time.Millisecond),
			What: "SIGSTOP to rank 1 (pid 11)", HealWhat: "SIGCONT to pid 11"},
		{Planned: Planned{Index: 1, Kind: "sigkill"}, AtStep: 60, Injected: t0.Add(6600 * time.Millisecond), What: "SIGKILL to rank 1 (pid 11)",
			RecoveredAt: t0.Add(7 * time.Second), RecoveryS: 0.4, Changes: "ring"},
	}
	for n := 0; n <= 8; n++ {
		v := verdict(n, n != 4, "evidence of invariant %d", n)
		if n == 6 {
			v = notApplicable(6, "a ring job has no parameter server")
		}
		r.Invariants = append(r.Invariants, v)
	}
	return r
}

// TestReportPageInChromium renders a report's page in a real headless
// Chromium and checks what it drew: the verdict, the nine invariants, two
// charts (steps and loss by time) of a point per step with every
// generation, fault and heal marked, and their legends. The
// screenshot is kept in $CHAOS_SCREENSHOT (default: the test's temporary
// directory).
func TestReportPageInChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed (scripts/install-chromium): the report page cannot be tested")
		}
		t.Skip("SKIPPED LOUDLY: chromium is not installed (run scripts/install-chromium); the report page is not tested")
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(f, sampleReport()); err != nil {
		t.Fatal(err)
	}
	f.Close()
	shot := os.Getenv("CHAOS_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(dir, "report.png")
	}
	flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=1000,1400"}
	const limit = 2 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	chromium := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, bin, append(flags, args...)...)
		// Killed at the deadline, chromium's own children may hold its
		// stdout open: Wait gives up on them.
		cmd.WaitDelay = 10 * time.Second
		return cmd
	}
	dom, err := chromium("--virtual-time-budget=5000", "--dump-dom", "file://"+page).Output()
	if ctx.Err() != nil {
		t.Fatalf("waited %v for chromium --dump-dom: %v", limit, err)
	}
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	d := string(dom)
	for what, want := range map[string]int{
		`id="result" class="fail"`: 1,
		`<tr class="pass">`:        7,
		`<tr class="fail">`:        1,
		`<tr class="na">`:          1,
		`<canvas`:                  2, // the two charts, drawn by the page's script
		`data-points="100"`:        1, // a point a step
		`data-marks="5"`:           1, // two generations, two faults, one heal
	} {
		if got := strings.Count(d, what); got != want {
			t.Errorf("the rendered page has %d of %s, want %d", got, what, want)
		}
	}
	// Both charts' legends name every colour drawn: the generations'
	// bands, the generation, fault and heal marks.
	for _, legend := range []string{"generation 1", "generation 2", "generation", "fault", "heal"} {
		if got := strings.Count(d, `</i>`+legend+`</span>`); got != 2 {
			t.Errorf("%d legends name %q, want both charts'", got, legend)
		}
	}
	err = chromium("--virtual-time-budget=5000", "--screenshot="+shot, "file://"+page).Run()
	if ctx.Err() != nil {
		t.Fatalf("waited %v for chromium --dump-dom and --screenshot: %v", limit, err)
	}
	if err != nil {
		t.Fatalf("chromium --screenshot: %v", err)
	}
	if st, err := os.Stat(shot); err != nil || st.Size() < 10000 {
		t.Fatalf("screenshot %s: %v (%v)", shot, st, err)
	}
	t.Logf("screenshot: %s", shot)
}
