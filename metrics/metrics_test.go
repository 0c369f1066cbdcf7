package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/phalanx-rt/phalanx/events"
)

// TestEmit: each job event moves the launcher's metric it names, and
// only that one.
func TestEmit(t *testing.T) {
	for _, c := range []struct {
		event  string
		fields []events.Field
		metric string
		want   float64
	}{
		{"generation", []events.Field{events.F("generation", uint64(4)), events.F("world", 3)}, "phalanx_generation", 4},
		{"generation", []events.Field{events.F("generation", uint64(4)), events.F("world", 3)}, "phalanx_world_size", 3},
		{"worker_lost", nil, "phalanx_workers_lost_total", 1},
		{"worker_left", nil, "phalanx_workers_left_total", 1},
		{"straggler_excluded", nil, "phalanx_stragglers_excluded_total", 1},
		{"straggler_readmitted", nil, "phalanx_stragglers_readmitted_total", 1},
		{"rank_restarted", []events.Field{events.F("rank", 2)}, "phalanx_rank_restarts_total", 1},
		{"checkpoint_saved", []events.Field{events.F("bytes", int64(1000)), events.F("seconds", 0.5)}, "phalanx_checkpoint_bytes_total", 1000},
		{"checkpoint_saved", []events.Field{events.F("bytes", int64(1000)), events.F("seconds", 0.5)}, "phalanx_checkpoints_saved_total", 1},
		{"checkpoint_failed", nil, "phalanx_checkpoint_failures_total", 1},
		{"ps_failover", nil, "phalanx_ps_failovers_total", 1},
		{"pipeline_step", []events.Field{events.F("stage", 1), events.F("bubble", 0.25)}, "phalanx_pipeline_bubble", 0.25},
	} {
		s := New("j", "launcher", Launcher)
		s.Emit(c.event, c.fields...)
		s.Emit("step", events.F("step", 3)) // not a launcher metric's
		fams, err := s.Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			for _, m := range f.Metric {
				v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
				switch {
				case f.GetName() == c.metric && v != c.want:
					t.Errorf("%s: %s = %v, want %v", c.event, c.metric, v, c.want)
				case f.GetName() != c.metric && v != 0 && (c.event != "generation" && c.event != "checkpoint_saved") && strings.HasPrefix(f.GetName(), "phalanx_"):
					t.Errorf("%s moved %s to %v too", c.event, f.GetName(), v)
				}
			}
		}
		if n := testutil.CollectAndCount(s.reg, c.metric); n != 1 {
			t.Errorf("%s: %d series of %s, want 1", c.event, n, c.metric)
		}
	}
}
