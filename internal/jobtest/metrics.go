package jobtest

import (
	"bufio"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// DocumentedMetrics reads docs/metrics.md's table (at path): each metric
// and the job kinds that serve it.
func DocumentedMetrics(t testing.TB, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "| `phalanx_") {
			continue
		}
		cells := strings.Split(l, "|")
		if len(cells) < 7 {
			t.Fatalf("%s: a row of %d cells: %q", path, len(cells), l)
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		var kinds []string
		for _, k := range strings.Split(cells[5], ",") {
			kinds = append(kinds, strings.TrimSpace(k))
		}
		out[name] = kinds
	}
	if len(out) < 10 {
		t.Fatalf("%s documents %d metrics: its table was not found", path, len(out))
	}
	return out
}

// Scrape reads an endpoint's metrics with Prometheus's text parser.
func Scrape(t testing.TB, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s's metrics: %v", addr, err)
	}
	return fams
}

// MetricValue is the sum of a family's samples whose labels include want
// (a histogram's: its count), and how many samples matched.
func MetricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (sum float64, n int) {
	f := fams[name]
	if f == nil {
		return 0, 0
	}
next:
	for _, m := range f.Metric {
		for k, v := range want {
			if !slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
				continue next
			}
		}
		n++
		switch {
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum, n
}

// MetricsMismatch compares a scrape with the documentation for kind: the
// metrics documented for it and not served, and those served and not
// documented at all.
func MetricsMismatch(docs map[string][]string, fams map[string]*dto.MetricFamily, kind string) (missing, undocumented []string) {
	for name, kinds := range docs {
		if slices.Contains(kinds, kind) && fams[name] == nil {
			missing = append(missing, name)
		}
	}
	for name := range fams {
		if _, ok := docs[name]; strings.HasPrefix(name, "phalanx_") && !ok {
			undocumented = append(undocumented, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(undocumented)
	return missing, undocumented
}
