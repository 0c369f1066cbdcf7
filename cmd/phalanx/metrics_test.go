package main

import (
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// TestMetricsOfEveryKind scrapes the one endpoint of a running
// parameter-server job and of a running pipeline job (the ring's is
// TestMetricsDocumented, at the root): every metric docs/metrics.md lists
// for the kind is served, with the kind's own figures (pushes and pulls;
// each stage's bubble), and none served is undocumented.
func TestMetricsOfEveryKind(t *testing.T) {
	docs := jobtest.DocumentedMetrics(t, "../../docs/metrics.md")
	for _, c := range []struct {
		kind string
		args []string
		// a figure of the kind's own that must have moved
		metric string
		labels map[string]string
	}{
		{"ps", []string{"--example", "sparse-lr", "--workers", "2", "--ps-servers", "2", "--epochs", "100000", "--examples", "20000",
			"--held-out", "2000", "--ids", "20000", "--report-every", "10"}, "phalanx_ps_pushes_total", nil},
		{"pipeline", append(pipeArgs(1000000), "--pp", "2"), "phalanx_pipeline_bubble", map[string]string{"stage": "1"}},
	} {
		t.Run(c.kind, func(t *testing.T) {
			j := startJob(t, append(c.args, "--metrics", "127.0.0.1:0")...)
			ev := j.Until(t, "the launcher's metrics address", func(e jobtest.Event) bool {
				return e["event"] == "metrics_serving" && e["process"] == "launcher"
			})
			addr := ev["address"].(string)
			j.Until(t, "a step", jobtest.Kind(map[string]string{"ps": "step", "pipeline": "pipeline_step"}[c.kind]))
			var missing, undocumented []string
			testwait.Until(t, time.Minute, "every metric documented for "+c.kind+" served", func() bool {
				fams := jobtest.Scrape(t, addr)
				missing, undocumented = jobtest.MetricsMismatch(docs, fams, c.kind)
				v, n := jobtest.MetricValue(fams, c.metric, c.labels)
				return len(missing) == 0 && n > 0 && v > 0
			})
			if len(undocumented) > 0 {
				t.Errorf("served and not in docs/metrics.md: %v", undocumented)
			}
		})
	}
}
