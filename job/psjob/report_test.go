package psjob

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/job"
)

// fieldSink records events as "kind key=value ..." lines.
type fieldSink []string

func (s *fieldSink) Emit(kind string, fields ...events.Field) error {
	parts := []string{kind}
	for _, f := range fields {
		parts = append(parts, f.Key+"="+strings.TrimSpace(strings.ReplaceAll(fmtValue(f.Value), "\n", " ")))
	}
	*s = append(*s, strings.Join(parts, " "))
	return nil
}

func fmtValue(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestPSReports: every parameter-server report, as a launched worker
// prints it, reads back as the same typed value, and becomes its event.
func TestPSReports(t *testing.T) {
	claim := Share{Worker: 1, Pid: 7, Share: 2, Steps: 100, Reason: "adopted", From: 40, ReplayedTo: 42}
	cases := []struct {
		rep   job.Report
		event string
	}{
		{Step{Worker: 0, Step: 20, Steps: 100, Epoch: 1, Loss: 0.5, SamplesPS: 900, Stale: 2},
			"step step=20 worker=0 epoch=1 loss=0.5 samples_per_s=900 stale=2"},
		{Checkpoint{Step: 50, Steps: 100, Shards: 4}, "checkpoint_saved step=50 shards=4"},
		{Done{Steps: 100, Metrics: map[string]float64{"auc": 0.9}}, ""},
		{claim, "ps_share share=2 worker=1 pid=7 reason=\"adopted\" from=40 replayed_to=42"},
		{ShareDone{Share: claim, Duplicates: 3}, "ps_share_done share=2 worker=1 pid=7 reason=\"adopted\" from=40 replayed_to=42 steps=100 duplicates=3"},
	}
	types := reportTypes()
	for _, tc := range cases {
		b, err := job.MarshalReport(tc.rep)
		if err != nil {
			t.Fatal(err)
		}
		got, err := types.Parse(launch.Line{Role: "ps-worker", Text: b})
		if err != nil || !reflect.DeepEqual(got, tc.rep) {
			t.Errorf("%s read back as %#v, %v; want %#v", b, got, err, tc.rep)
		}
		var ev fieldSink
		job.Emit(&ev, 1, tc.rep)
		if strings.Join(ev, "\n") != tc.event {
			t.Errorf("%T's event: %q, want %q", tc.rep, strings.Join(ev, "\n"), tc.event)
		}
	}
}
