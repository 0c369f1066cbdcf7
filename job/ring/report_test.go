package ring

import (
	"reflect"
	"testing"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
)

// TestCheckpointReportJSON: a checkpoint report, as a launched worker
// prints it, has its step at the top level and snake_case fields, as every
// other report and event.
func TestCheckpointReportJSON(t *testing.T) {
	b, err := job.MarshalReport(checkpointReport(checkpoint.Event{Kind: "saved", ID: "step-7", URL: "/c/step-7", Step: 7, Bytes: 10,
		Seconds: 0.5, WorldAfter: 2, ManifestCRC: 9}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"checkpoint","step":7,"checkpoint":{"kind":"saved","id":"step-7","url":"/c/step-7","step":7,"bytes":10,"seconds":0.5,"world_after":2,"manifest_crc32c":9}}`
	if string(b) != want {
		t.Fatalf("printed\n%s\nwant\n%s", b, want)
	}
}

// TestRingReportsReadBack: every ring report, as a launched worker prints
// it, reads back in the launcher as the same typed value.
func TestRingReportsReadBack(t *testing.T) {
	types := reportTypes()
	for _, rep := range []job.Report{
		Step{Step: 3, Generation: 2, World: 4, Loss: 0.5, Accuracy: 0.75, SamplesPS: 1000, StepS: 0.1, Fingerprint: [5]float64{1, 2, 3, 4, 5},
			Participants: 3, Stale: 1, Replayed: true, TrainedIn: 1},
		Restored{Generation: 2, World: 3, Step: 40, Redone: 2, Root: 1, DataPlane: "tcp"},
		Restart{Rank: 1, Step: 9, Reason: "panic", Restarts: 2},
		OverlapFallback{Step: 4, Late: []int{2}, DeadlineS: 0.5},
		Fed{ID: "w-3", Step: 12},
		Done{Step: 300, Generation: 3, World: 4, Loss: 0.1, Accuracy: 0.96, Identical: true, ParamsCRC: 7, RankCRCs: []uint32{7, 7}},
		checkpointReport(checkpoint.Event{Kind: "restored", Step: 50, WorldBefore: 4, WorldAfter: 3}),
		job.Failed{Reason: "boom"},
	} {
		b, err := job.MarshalReport(rep)
		if err != nil {
			t.Fatal(err)
		}
		got, err := types.Parse(launch.Line{Role: "worker", Text: b})
		if err != nil || !reflect.DeepEqual(got, rep) {
			t.Errorf("%s read back as %#v, %v; want %#v", b, got, err, rep)
		}
	}
}
