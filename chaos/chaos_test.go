package chaos

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/kindtest"
)

func TestMain(m *testing.M) {
	phalanx.Main(kindtest.Registry(examples.Registry())) // a worker process a test's launch started (the barrier kind: TestRunnerThirdKind)
	os.Exit(m.Run())
}

// TestPlanReplayable: the same scenario and seed give the same schedule;
// another seed gives another.
func TestPlanReplayable(t *testing.T) {
	sc, err := Lookup("kill-random")
	if err != nil {
		t.Fatal(err)
	}
	sc.Faults = append(sc.Faults, FaultSpec{Kind: "sigstop", Target: "random", Trigger: Trigger{Step: 10, StepMax: 90}, Duration: Duration(time.Second)})
	a, b := sc.Plan(42), sc.Plan(42)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("seed 42 planned %+v, then %+v", a, b)
	}
	differ := false
	for seed := uint64(1); seed < 10; seed++ {
		differ = differ || !reflect.DeepEqual(a, sc.Plan(seed))
	}
	if !differ {
		t.Fatal("nine other seeds all gave seed 42's schedule")
	}
	for i, p := range a {
		tr := sc.Faults[i].Trigger
		if p.Step < tr.Step || p.Step > tr.StepMax || !p.RandomRank {
			t.Errorf("planned %+v: want a random rank at a step in the trigger's range", p)
		}
	}
}

func TestValidate(t *testing.T) {
	good := func() Scenario { s, _ := Lookup("kill-all-resize"); return s }
	for _, tc := range []struct {
		name, want string
		edit       func(*Scenario)
	}{
		{"unknown kind", `unknown kind "explode"`, func(s *Scenario) { s.Faults[0].Kind = "explode" }},
		{"trigger past the end", "not before the job's last step", func(s *Scenario) { s.Faults[0].Trigger.StepMax = s.Job.Steps }},
		{"no trigger", "needs a step, an after or an on", func(s *Scenario) { s.Faults[0].Trigger = Trigger{} }},
		{"unknown event", `trigger on "lunch"`, func(s *Scenario) { s.Faults[0].Trigger = Trigger{On: "lunch"} }},
		{"launch with a step", "takes no step or after", func(s *Scenario) { s.Faults[0].Trigger = Trigger{On: "launch", Step: 5} }},
		{"launch with a rank", "no ring yet", func(s *Scenario) {
			s.Faults[0] = FaultSpec{Kind: "sigkill", Target: "random", Trigger: Trigger{On: "launch"}}
		}},
		{"upload without MinIO", "needs checkpoints in MinIO", func(s *Scenario) { s.Faults[0].Trigger = Trigger{On: "upload"} }},
		{"upload with an after", "a step at most", func(s *Scenario) {
			s.Job.Store = "minio"
			s.Faults[0].Trigger = Trigger{On: "upload", After: Duration(time.Second)}
		}},
		{"upload in namespaces", "needs job.network loopback", func(s *Scenario) {
			s.Job.Store, s.Job.Network = "minio", "netns"
			s.Faults[0].Trigger = Trigger{On: "upload"}
		}},
		{"uploader without upload", "target uploader needs a trigger on upload", func(s *Scenario) {
			s.Faults[0] = FaultSpec{Kind: "sigkill", Target: "uploader", Trigger: Trigger{Step: 5}}
		}},
		{"no checkpoints", "takes no checkpoints", func(s *Scenario) { s.Job.CheckpointEvery = 0 }},
		{"rank out of range", `target "rank:9"`, func(s *Scenario) {
			s.Faults[0] = FaultSpec{Kind: "sigkill", Target: "rank:9", Trigger: Trigger{Step: 5}}
		}},
		{"no target", "needs a target", func(s *Scenario) { s.Faults[0] = FaultSpec{Kind: "sigkill", Trigger: Trigger{Step: 5}} }},
		{"stop without duration", "needs a duration", func(s *Scenario) {
			s.Faults[0] = FaultSpec{Kind: "sigstop", Target: "rank:1", Trigger: Trigger{Step: 5}}
		}},
		{"ps-ack-lost without duration", "(ps-ack-lost): it needs a duration", func(s *Scenario) {
			s.Job.Kind, s.Job.CheckpointEvery = "ps", 0
			s.Faults[0] = FaultSpec{Kind: "ps-ack-lost", Trigger: Trigger{Step: 5}}
		}},
		{"bad expect", `expect "maybe"`, func(s *Scenario) { s.Expect = "maybe" }},
		{"no workers", "job.workers 0", func(s *Scenario) { s.Job.Workers = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.edit(&s)
			err := s.Validate(DefaultKinds())
			if err == nil || !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an ErrScenario saying %q", err, tc.want)
			}
		})
	}
	for _, s := range Builtin() {
		if err := s.Validate(DefaultKinds()); err != nil {
			t.Errorf("built-in %s: %v", s.Name, err)
		}
	}
}

func TestLoadScenario(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"a.json": `{"name":"a","job":{"workers":3,"steps":50},"faults":[{"kind":"sigkill","target":"random","trigger":{"step":10,"step_max":20}}]}`,
		"b.yaml": "name: b\njob:\n  workers: 3\n  steps: 50\nfaults:\n  - kind: sigstop\n    target: rank:1\n    duration: 1.5s\n    trigger: {step: 10}\n",
		"c.json": `{"name":"c","job":{"workers":3,"steps":50},"fautls":[]}`,
		"d.yaml": "name: d\njob: {workers: 3, steps: 50}\nfaults:\n  - kind: sigstop\n    duration: soon\n",
		"e.txt":  `{}`,
		"f.yaml": "name: f\njob:\n  workers: 3\n  steps: 50\nfaults:\n  - kind: sigkill\n    trigger:\n      step: ten\n",
		"g.yaml": "name: g\njob:\n  workers: 3\n  stpes: 50\n",
		"h.yaml": "name: h\njob:\n  workers: [3\n",
		"i.json": "{\n  \"name\": \"i\",\n  \"job\": {\"workers\": \"three\"}\n}\n",
	}
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := LoadScenario(filepath.Join(dir, "a.json"))
	if err != nil || a.Faults[0].Trigger.StepMax != 20 || a.Validate(DefaultKinds()) != nil {
		t.Fatalf("a.json: %+v, %v", a, err)
	}
	b, err := LoadScenario(filepath.Join(dir, "b.yaml"))
	if err != nil || time.Duration(b.Faults[0].Duration) != 1500*time.Millisecond || b.Validate(DefaultKinds()) != nil {
		t.Fatalf("b.yaml: %+v, %v", b, err)
	}
	for n, want := range map[string]string{"c.json": `c.json:1: json: unknown field "fautls"`, "d.yaml": "d.yaml:5: ", "e.txt": "want a .json",
		"f.yaml": "f.yaml:8: json: cannot unmarshal string", "g.yaml": `g.yaml:4: json: unknown field "stpes"`, "h.yaml": "line 3",
		"i.json": "i.json:3: json: cannot unmarshal string"} {
		if _, err := LoadScenario(filepath.Join(dir, n)); err == nil || !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an ErrScenario saying %q", n, err, want)
		}
	}
}

// TestCISetCoversEveryKind: the CI set injects every built-in fault kind.
func TestCISetCoversEveryKind(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range CISet() {
		s, err := Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range s.Faults {
			seen[f.Kind] = true
		}
	}
	for _, k := range DefaultKinds().Names() {
		if !seen[k] {
			t.Errorf("no CI scenario injects %s", k)
		}
	}
}

// TestCIScenarios runs the CI set against real jobs: every invariant of
// every run holds, and each report names its faults' evidence. The
// reports go to $CHAOS_REPORT_DIR when set. Scenarios beside a service
// (an etcd cluster, MinIO, namespaces, parameter servers) run in their
// family's test, which asserts more of each (TestEtcdScenarios,
// TestMinIOScenarios, TestNetnsScenarios, TestPSScenarios).
func TestCIScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("real jobs: not in -short")
	}
	r := &Runner{Registry: examples.Registry(), Dir: jobtest.KeptDir(t)}
	var reports []*Report
	for _, n := range CISet() {
		sc, _ := Lookup(n)
		if j := sc.Job; j.Etcd == "cluster" || j.Store == "minio" || j.Network == "netns" || j.Kind == "ps" {
			continue
		}
		t.Run(n, func(t *testing.T) {
			rep := runAndCheck(t, r, sc, 1)
			reports = append(reports, rep)
			if n == "hybrid-stop" && !strings.Contains(rep.Invariants[2].Evidence, "recorded stale ranks' samples as dropped") {
				t.Errorf("the stopped rank's steps dropped nothing as stale: %s", rep.Invariants[2].Evidence)
			}
			if !rep.Passed {
				t.Errorf("the run failed; kept in %s", rep.Dir)
			}
		})
	}
	var sb strings.Builder
	WriteSummary(&sb, reports)
	t.Logf("\n%s", sb.String())
}

// runAndCheck runs sc with seed, writes its report to $CHAOS_REPORT_DIR
// when set, and fails t for every invariant that failed and every fault
// that was not injected or left no evidence.
func runAndCheck(t *testing.T, r *Runner, sc Scenario, seed uint64) *Report {
	t.Helper()
	const limit = 5 * time.Minute // its undisturbed reference and the run
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	rep, err := r.Run(ctx, sc, seed)
	if ctx.Err() != nil {
		t.Fatalf("waited %v for scenario %s (seed %d): %v", limit, sc.Name, seed, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv("CHAOS_REPORT_DIR"); dir != "" {
		if _, err := rep.WriteJSON(dir); err != nil {
			t.Error(err)
		}
	}
	for _, v := range rep.Invariants {
		t.Logf("invariant %d %s: %s", v.N, v.Status, v.Evidence)
		if v.Status == "fail" {
			t.Errorf("invariant %d (%s) failed: %s", v.N, v.Name, v.Evidence)
		}
	}
	for _, f := range rep.Faults {
		if f.What == "" || f.Injected.IsZero() || f.Error != "" {
			t.Errorf("fault %d (%s) left no evidence or failed: %+v", f.Index, f.Kind, f)
		}
	}
	return rep
}
