package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRecoveryVerdict: invariant 8 from timed faults' recoveries: n/a with
// none timed, a pass listing each within the bound, a failure naming each
// fault that did not recover or took longer than the bound, at most five.
func TestRecoveryVerdict(t *testing.T) {
	rec := func(i int, secs float64) recovery {
		return recovery{fault: &FaultRecord{Planned: Planned{Index: i, Kind: "worker-kill"}, RecoveryS: secs},
			how: fmt.Sprintf("%.2fs", secs)}
	}
	lost := func(i int) recovery {
		return recovery{fault: &FaultRecord{Planned: Planned{Index: i, Kind: "worker-kill"}}, missing: "no step after it"}
	}
	var sevenLost []recovery
	for i := range 7 {
		sevenLost = append(sevenLost, lost(i))
	}
	for _, tc := range []struct {
		name   string
		timed  []recovery
		status string
		says   []string
		not    []string
	}{
		{"none timed", nil, "n/a", []string{"nothing timed"}, nil},
		{"within the bound", []recovery{rec(0, 1.5), rec(1, 10)}, "pass",
			[]string{"the span: fault 0 (worker-kill): 1.50s; fault 1 (worker-kill): 10.00s (bound 10s)"}, nil},
		{"over the bound", []recovery{rec(0, 1.5), rec(1, 10.01)}, "fail",
			[]string{"fault 1 (worker-kill): 10.01s, over the bound 10s"}, []string{"fault 0"}},
		{"not recovered", []recovery{lost(0), rec(1, 2)}, "fail",
			[]string{"fault 0 (worker-kill): no step after it"}, []string{"fault 1"}},
		{"at most five named", sevenLost, "fail",
			[]string{"fault 4 (worker-kill): no step after it; and 2 more"}, []string{"fault 5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := recoveryVerdict(tc.timed, 10*time.Second, "nothing timed", "the span")
			if v.N != 8 || v.Status != tc.status {
				t.Fatalf("%+v: want invariant 8 %s", v, tc.status)
			}
			for _, s := range tc.says {
				if !strings.Contains(v.Evidence, s) {
					t.Errorf("evidence %q: want %q in it", v.Evidence, s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(v.Evidence, s) {
					t.Errorf("evidence %q: want no %q in it", v.Evidence, s)
				}
			}
		})
	}
}

// TestSummaryLegend: the terminal table numbers its invariant columns, and
// the lines under it name every one of them, so a reader of "fail" under
// column 5 knows which guarantee broke.
func TestSummaryLegend(t *testing.T) {
	rep := &Report{Scenario: "kill-one", Seed: 1, Passed: true}
	for n := range invariantNames {
		rep.Invariants = append(rep.Invariants, verdict(n, true, "ok"))
	}
	var sb strings.Builder
	WriteSummary(&sb, []*Report{rep})
	out := sb.String()
	for _, want := range []string{"scenario  seed  faults  recovery max  0     1", "kill-one  1     0       -             pass  pass", "invariants:\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	for n, name := range invariantNames {
		if line := fmt.Sprintf("\n  %d  %s\n", n, name); !strings.Contains(out, line) {
			t.Errorf("the legend does not name column %d (%q):\n%s", n, name, out)
		}
	}
}
