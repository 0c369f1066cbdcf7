package status

import (
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Scraped takes the job's workers' metrics gathered at t (the launcher's
// scraper's families, each series labelled with its worker,
// "<role>-<index>"): each worker that answered was alive at t, at the
// step and samples/s its metrics say.
func (m *Model) Scraped(fams []*dto.MetricFamily, t time.Time) {
	step := map[string]float64{}
	samples := map[string]float64{}
	for _, f := range fams {
		name := f.GetName()
		if name != "phalanx_step" && name != "phalanx_samples_total" {
			continue
		}
		for _, s := range f.Metric {
			w := label(s, "worker")
			if name == "phalanx_step" {
				step[w] = max(step[w], s.GetGauge().GetValue())
			} else {
				samples[w] += s.GetCounter().GetValue()
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := false
	for i := range m.snap.Workers {
		w := &m.snap.Workers[i]
		name := w.name()
		st, ok := step[name]
		if !ok {
			continue
		}
		changed = true
		w.LastSeen, w.Step = t, int64(st)
		if last, ok := m.lastRate[w.Index]; ok && t.After(last.at) && samples[name] >= last.samples {
			w.SamplesPerS = (samples[name] - last.samples) / t.Sub(last.at).Seconds()
		}
		m.lastRate[w.Index] = rate{samples: samples[name], at: t}
	}
	if changed {
		m.touch(t)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
