package chaos

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"

	"github.com/phalanx-rt/phalanx/webui"
)

// WriteHTML writes a self-contained page of one run: its verdicts, its
// faults, and two charts drawn with Phalanx's charts over uPlot (package
// webui, inlined): the step reached by time, and the loss by time, each
// with its generations shaded and its faults, heals and relaunches
// marked, axes with values and a legend. It needs no network.
func WriteHTML(w io.Writer, r *Report) error {
	p, err := pageOf(r)
	if err != nil {
		return err
	}
	return pageTemplate.Execute(w, p)
}

type page struct {
	R      *Report
	Assets template.HTML
	Data   template.JS
}

// chartPoint and chartMark are the charts' data (webui's charts.js).
type chartPoint struct {
	Step       int64   `json:"step"`
	Loss       float64 `json:"loss"`
	Generation int64   `json:"generation"`
	T          float64 `json:"t"`
}

type chartMark struct {
	Step  int64   `json:"step"`
	T     float64 `json:"t"`
	Kind  string  `json:"kind"`
	Label string  `json:"label"`
}

// chartData is what the page's script draws: the steps and the marks, on
// a time axis that starts at the first step (the run's start-up is not
// drawn: it says nothing).
type chartData struct {
	T0    float64      `json:"t0"`
	Curve []chartPoint `json:"curve"`
	Marks []chartMark  `json:"marks"`
}

func pageOf(r *Report) (page, error) {
	d := chartData{Curve: []chartPoint{}, Marks: []chartMark{}}
	if len(r.Steps) > 0 {
		d.T0 = r.Steps[0].T
	}
	for _, s := range r.Steps {
		d.Curve = append(d.Curve, chartPoint{Step: s.Step, Loss: s.Loss, Generation: s.Generation, T: s.T})
	}
	launch := 1
	for _, g := range r.Generations {
		if g.Launch > launch {
			launch = g.Launch
			d.Marks = append(d.Marks, chartMark{T: g.T, Kind: "relaunch", Label: fmt.Sprintf("launch %d", g.Launch)})
		}
		d.Marks = append(d.Marks, chartMark{T: g.T, Kind: "generation", Label: fmt.Sprintf("generation %d: %d workers", g.Generation, g.World)})
	}
	for _, f := range r.Faults {
		if f.Injected.IsZero() {
			continue
		}
		d.Marks = append(d.Marks, chartMark{T: f.Injected.Sub(r.Started).Seconds(), Step: f.AtStep, Kind: "fault",
			Label: fmt.Sprintf("fault %d: %s", f.Index, f.Kind)})
		if !f.Healed.IsZero() && f.HealWhat != "" {
			d.Marks = append(d.Marks, chartMark{T: f.Healed.Sub(r.Started).Seconds(), Kind: "heal", Label: fmt.Sprintf("heal %d", f.Index)})
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		return page{}, fmt.Errorf("chaos: the report's charts: %w", err)
	}
	return page{R: r, Assets: template.HTML(webui.Inline()), Data: template.JS(b)}, nil
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"secs": func(r *Report, f *FaultRecord) string {
		if f.Injected.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%.2f", f.Injected.Sub(r.Started).Seconds())
	},
	"healed": func(r *Report, f *FaultRecord) string {
		if f.Healed.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%.2f", f.Healed.Sub(r.Started).Seconds())
	},
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>chaos: {{.R.Scenario}} seed {{.R.Seed}}</title>
{{.Assets}}
<style>
body { font-family: sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 12px 0; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; font-size: 14px; }
.chart { max-width: 1000px; }
.pass { background: #e6f4ea; } .fail { background: #fce8e6; } .na { color: #777; }
h1 span.pass, h1 span.fail { padding: 2px 10px; border-radius: 4px; }
</style></head>
<body>
<h1>{{.R.Scenario}} <small>seed {{.R.Seed}}</small> {{if .R.Passed}}<span id="result" class="pass">PASS</span>{{else}}<span id="result" class="fail">FAIL</span>{{end}}</h1>
<p>{{.R.Description}}</p>
<p>{{.R.DurationS | printf "%.1f"}} s, {{.R.Launches}} launch(es); ended at step {{.R.Step}}, held-out accuracy {{.R.Accuracy | printf "%.4f"}} (undisturbed {{.R.RefAccuracy | printf "%.4f"}}){{if .R.Error}}; error: {{.R.Error}}{{end}}.</p>
<h2>Invariants</h2>
<table id="invariants"><tr><th>#</th><th>invariant</th><th>verdict</th><th>evidence</th></tr>
{{range .R.Invariants}}<tr class="{{if eq .Status "pass"}}pass{{else if eq .Status "fail"}}fail{{else}}na{{end}}"><td>{{.N}}</td><td>{{.Name}}</td><td>{{.Status}}</td><td>{{.Evidence}}</td></tr>
{{end}}</table>
<h2>Faults</h2>
<table id="faults"><tr><th>#</th><th>kind</th><th>step</th><th>injected (s)</th><th>healed (s)</th><th>recovery (s)</th><th>what</th></tr>
{{range .R.Faults}}<tr><td>{{.Index}}</td><td>{{.Kind}}</td><td>{{.AtStep}}</td><td>{{secs $.R .}}</td><td>{{healed $.R .}}</td><td>{{if .RecoveryS}}{{printf "%.2f" .RecoveryS}}{{else}}-{{end}}</td><td>{{.What}}{{if .HealWhat}}; {{.HealWhat}}{{end}}{{if .Error}} <b>{{.Error}}</b>{{end}}</td></tr>
{{end}}</table>
<h2>Steps</h2>
<div id="timeline" class="chart"></div>
<h2>Loss</h2>
<div id="loss" class="chart"></div>
<script>
"use strict";
(function () {
  var d = {{.Data}};
  var steps = { curve: d.curve.map(function (p) { return { step: p.step, loss: p.step, generation: p.generation, t: p.t }; }), marks: d.marks };
  phalanxCharts.lossChart(document.getElementById("timeline"), steps,
    { x: "t", t0: d.t0, height: 260, xLabel: "seconds from the first step", yLabel: "step", logY: false, series: "step" });
  phalanxCharts.lossChart(document.getElementById("loss"), d,
    { x: "t", t0: d.t0, height: 260, xLabel: "seconds from the first step" });
  document.body.dataset.points = d.curve.length;
  document.body.dataset.marks = d.marks.length;
})();
</script>
</body></html>
`))
