package pipeline

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/worker"
)

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

// TestStepEventsAcrossGenerations: the job's step events as a new
// generation changes replica 0. The step its replica 0 holds, reported
// again by its last stage (replayed), becomes a step event (with the
// generation that trained it) only when the launcher has not emitted that
// step: the replica 0 that trained it may have been killed between the
// step and its report, or its report may arrive after the replay. And a
// replayed step older than the last step event (the lost replica 0
// applied and reported a step the new one never finished) is a rollback:
// restored, then the steps after it again. The layout, which another
// stage reports on another pipe, plays no part.
func TestStepEventsAcrossGenerations(t *testing.T) {
	fp := worker.Fingerprint{64, 2016, 7, 0, 9}
	step := func(s int64, gen uint64) Step {
		return Step{Step: s, Stage: 1, Generation: gen, Replicas: 2, Samples: 64, World: 4, Fingerprint: fp}
	}
	replay := func(s int64, trained, gen uint64) Step {
		r := step(s, gen)
		r.Replayed, r.TrainedIn, r.Replicas = true, trained, 1
		return r
	}
	kept := func(s int64, gen uint64) Layout { return Layout{Generation: gen, Replicas: 1, Step: s, Donor: 0} }
	tests := []struct {
		name  string
		lines []job.Report
		want  []string
	}{
		{"lost before its report", []job.Report{step(104, 1), Step{Step: 105, Stage: 0, Generation: 1}, kept(105, 2), replay(105, 1, 2), step(106, 2)},
			[]string{"step 104 of 1", "step 105 of 1", "step 106 of 2"}},
		{"reported already", []job.Report{step(104, 1), step(105, 1), kept(105, 2), replay(105, 1, 2), step(106, 2)},
			[]string{"step 104 of 1", "step 105 of 1", "step 106 of 2"}},
		{"its report late, after the replay", []job.Report{step(104, 1), kept(105, 2), replay(105, 1, 2), step(105, 1), step(106, 2)},
			[]string{"step 104 of 1", "step 105 of 1", "step 106 of 2"}},
		{"a replica 0 kept", []job.Report{step(104, 1), step(105, 1), replay(105, 1, 2), step(106, 2), replay(106, 2, 3), step(107, 3)},
			[]string{"step 104 of 1", "step 105 of 1", "step 106 of 2", "step 107 of 3"}},
		{"the kept replica a step behind", []job.Report{step(117, 1), step(118, 1), kept(117, 2), replay(117, 1, 2), step(118, 2)},
			[]string{"step 117 of 1", "step 118 of 1", "restored 117 of 2, 1 redone, world 2", "step 118 of 2"}},
		{"the layout read after the new steps", []job.Report{step(104, 1), replay(105, 1, 2), step(106, 2), step(107, 2), kept(105, 2), step(108, 2)},
			[]string{"step 104 of 1", "step 105 of 1", "step 106 of 2", "step 107 of 2", "step 108 of 2"}},
		{"a late report of the lost replica after the rollback", []job.Report{step(117, 1), replay(116, 1, 2), step(117, 1), step(117, 2)},
			[]string{"step 117 of 1", "restored 116 of 2, 1 redone, world 2", "step 117 of 2"}},
		{"restored from a commit", []job.Report{step(118, 1), Layout{Generation: 2, Replicas: 1, Step: 118, Donor: 0},
			StageRestored{Stage: 1, Source: "commit", Step: 115, Lost: 118, Generation: 2}, step(116, 2)},
			[]string{"step 118 of 1", "restored 115 of 2, 3 redone, world 2", "step 116 of 2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			pj := &pipeJob{Env: &job.Env{LC: &job.LaunchConfig{Config: job.Config{Steps: 400, Pipeline: job.PipelineConfig{Stages: 2}}}, Out: io.Discard,
				Events: events.New(&buf, func() time.Time { return time.Unix(0, 0) })},
				types: job.NewReportTypes(Step{}, Done{}, StageDone{}, Layout{}, StageRestored{}), line: stepLine{stages: 2},
				progress: job.Progress{Steps: 400, Every: 1000}}
			for _, rep := range tc.lines {
				b, err := job.MarshalReport(rep)
				if err != nil {
					t.Fatal(err)
				}
				if err := pj.handle(launch.Line{Text: b}); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
				var e struct {
					Event       string
					Step        int64
					Generation  int64
					World       int64
					Redone      int64 `json:"steps_redone"`
					Fingerprint []float64
				}
				if err := json.Unmarshal(l, &e); err != nil {
					t.Fatalf("event %q: %v", l, err)
				}
				switch e.Event {
				case "step":
					if len(e.Fingerprint) != len(fp) || e.Fingerprint[1] != fp[1] {
						t.Errorf("step %d's event: fingerprint %v, want %v", e.Step, e.Fingerprint, fp)
					}
					got = append(got, fmt.Sprintf("step %d of %d", e.Step, e.Generation))
				case "restored":
					got = append(got, fmt.Sprintf("restored %d of %d, %d redone, world %d", e.Step, e.Generation, e.Redone, e.World))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("events %q, want %q:\n%s", got, tc.want, buf.Bytes())
			}
		})
	}
}
