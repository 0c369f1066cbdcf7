package ring

import (
	"encoding/json"
	"testing"

	"github.com/phalanx-rt/phalanx/checkpoint"
)

// TestCheckpointReportJSON: a checkpoint report, as a launched worker
// prints it, has its step at the top level and snake_case fields, as every
// other report and event.
func TestCheckpointReportJSON(t *testing.T) {
	b, err := json.Marshal(checkpointReport(checkpoint.Event{Kind: "saved", ID: "step-7", URL: "/c/step-7", Step: 7, Bytes: 10,
		Seconds: 0.5, WorldAfter: 2, ManifestCRC: 9}))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"checkpoint","step":7,"generation":0,"world":0,"rank":0,"loss":0,"accuracy":0,"samples_per_s":0,"compute_s":0,"comm_s":0,"step_s":0,"epoch":0,"offset":0,"fingerprint":[0,0,0,0,0],"steps_redone":0,"root":0,` +
		`"checkpoint":{"kind":"saved","id":"step-7","url":"/c/step-7","step":7,"bytes":10,"seconds":0.5,"world_after":2,"manifest_crc32c":9}}`
	if string(b) != want {
		t.Fatalf("printed\n%s\nwant\n%s", b, want)
	}
}
