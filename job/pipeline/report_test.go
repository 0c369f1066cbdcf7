package pipeline

import "testing"

// TestStepLineGathersInterleavedReports: the stages' reports of
// consecutive steps arrive interleaved (stage 0 of step 2 before stage 1
// of step 1), and every step still completes once, with its own reports;
// a step a lost stage never finishes is dropped once far behind.
func TestStepLineGathersInterleavedReports(t *testing.T) {
	l := stepLine{stages: 2}
	var done []int64
	for _, r := range []Step{{Step: 1, Stage: 0}, {Step: 2, Stage: 0}, {Step: 1, Stage: 1}, {Step: 3, Stage: 0}, {Step: 2, Stage: 1},
		{Step: 3, Stage: 1}, {Step: 4, Stage: 7}} {
		if all := l.add(r); all != nil {
			for st, s := range all {
				if s.Step != r.Step || s.Stage != st {
					t.Fatalf("step %d's reports hold %+v at stage %d", r.Step, s, st)
				}
			}
			done = append(done, r.Step)
		}
	}
	if len(done) != 3 || done[0] != 1 || done[1] != 2 || done[2] != 3 {
		t.Errorf("steps completed %v, want [1 2 3]", done)
	}
	l.add(Step{Step: 10, Stage: 0}) // its stage 1 never reports
	for s := int64(11); s <= 10+stepLineWindow+1; s++ {
		l.add(Step{Step: s, Stage: 0})
		l.add(Step{Step: s, Stage: 1})
	}
	if _, ok := l.pending[10]; ok || len(l.pending) > 1 {
		t.Errorf("%d steps pending, step 10 among them: %v", len(l.pending), l.pending[10] != nil)
	}
}
