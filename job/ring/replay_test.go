package ring

import (
	"bytes"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/worker"
)

// TestReplayedStepKeepsItsRing: the step a new generation's rank 0 reports
// again after a ring change becomes a step event with the world, generation
// and participants of the ring that trained it (the chaos harness checks
// its samples against that ring's split of the batch); a step the launcher
// has already reported is not reported twice.
func TestReplayedStepKeepsItsRing(t *testing.T) {
	fp := worker.Fingerprint{96, 12473, 1051, 0, 11598}
	trained := worker.StepStats{Step: 147, World: 4, Participants: 3, Generation: 1, Samples: 96, Fingerprint: fp,
		Position: worker.Position{Epoch: 1, Offset: 512}}
	tests := []struct {
		name  string
		lines []Step
		want  []map[string]any // the step events' checked fields
	}{
		{"never seen", []Step{
			{Step: 146, Generation: 1, World: 4, Participants: 3, Stale: 1},
			replayedStep(trained, 2),
			{Step: 148, Generation: 2, World: 3},
		}, []map[string]any{
			{"step": 146.0, "generation": 1.0, "world": 4.0, "participants": 3.0, "stale": 1.0},
			{"step": 147.0, "generation": 1.0, "world": 4.0, "participants": 3.0, "stale": 1.0, "fingerprint": []any{96.0, 12473.0, 1051.0, 0.0, 11598.0}},
			{"step": 148.0, "generation": 2.0, "world": 3.0, "participants": 3.0},
		}},
		{"seen already", []Step{
			{Step: 147, Generation: 1, World: 4, Participants: 3, Stale: 1},
			replayedStep(trained, 2),
		}, []map[string]any{
			{"step": 147.0, "generation": 1.0, "world": 4.0, "participants": 3.0, "stale": 1.0},
		}},
		{"a synchronous step", []Step{
			replayedStep(worker.StepStats{Step: 9, World: 4, Generation: 3}, 4),
		}, []map[string]any{
			{"step": 9.0, "generation": 3.0, "world": 4.0, "participants": 4.0, "stale": 0.0},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			r := newRingJob(&job.Env{LC: &job.LaunchConfig{Config: job.Config{Steps: 300}, LogEvery: 1000}, Events: events.New(&buf, func() time.Time { return time.Unix(0, 0) }), Out: io.Discard}, nil)
			for _, rep := range tc.lines {
				b, err := job.MarshalReport(rep)
				if err != nil {
					t.Fatal(err)
				}
				if err := r.handle(launch.Line{Text: b}); err != nil {
					t.Fatal(err)
				}
			}
			var got []map[string]any
			lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
			for _, l := range lines {
				var e map[string]any
				if err := json.Unmarshal(l, &e); err != nil {
					t.Fatalf("event %q: %v", l, err)
				}
				got = append(got, e)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d step events, want %d:\n%s", len(got), len(tc.want), buf.Bytes())
			}
			for i, w := range tc.want {
				for k, v := range w {
					g, _ := json.Marshal(got[i][k])
					x, _ := json.Marshal(v)
					if !bytes.Equal(g, x) {
						t.Errorf("step event %d: %s is %s, want %s: %s", i, k, g, x, lines[i])
					}
				}
			}
		})
	}
}
