package chaos

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

// WriteHTML writes a self-contained page of one run: its verdicts, its
// faults, a timeline of faults, generations and steps, and the loss curve.
// It needs no script and no network.
func WriteHTML(w io.Writer, r *Report) error {
	return pageTemplate.Execute(w, pageOf(r))
}

type page struct {
	R        *Report
	Timeline template.HTML
	Loss     template.HTML
}

const (
	plotW, plotH = 900.0, 260.0
	padL, padB   = 60.0, 30.0
)

func pageOf(r *Report) page {
	return page{R: r, Timeline: timelineSVG(r), Loss: lossSVG(r)}
}

// axes maps data to the plot's pixels.
type axes struct{ x0, x1, y0, y1 float64 }

func (a axes) x(v float64) float64 {
	return padL + (v-a.x0)/math.Max(a.x1-a.x0, 1e-9)*(plotW-padL-10)
}

func (a axes) y(v float64) float64 {
	return plotH - padB - (v-a.y0)/math.Max(a.y1-a.y0, 1e-9)*(plotH-padB-10)
}

func svgOpen(b *strings.Builder, id, title string) {
	fmt.Fprintf(b, `<svg id="%s" xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`,
		id, plotW, plotH, plotW, plotH, template.HTMLEscapeString(title))
	fmt.Fprintf(b, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="#fff"/>`, plotW, plotH)
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#333"/>`, padL, plotH-padB, plotW-10, plotH-padB)
	fmt.Fprintf(b, `<line x1="%.0f" y1="10" x2="%.0f" y2="%.0f" stroke="#333"/>`, padL, padL, plotH-padB)
}

// timelineSVG: steps (x time, y step; colour by world size), generations
// as grey lines, faults as red lines with their index, heals in green.
func timelineSVG(r *Report) template.HTML {
	var b strings.Builder
	svgOpen(&b, "timeline", "timeline of faults and steps")
	a := axes{x0: 0, x1: math.Max(r.DurationS, 1), y0: 0, y1: float64(max(r.Step, 1))}
	for _, s := range r.Steps {
		a.y1 = math.Max(a.y1, float64(s.Step))
	}
	colours := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"}
	for _, g := range r.Generations {
		x := a.x(g.T)
		fmt.Fprintf(&b, `<line class="generation" x1="%.1f" y1="10" x2="%.1f" y2="%.0f" stroke="#bbb" stroke-dasharray="3,3"><title>generation %d: %d workers (%s)</title></line>`,
			x, x, plotH-padB, g.Generation, g.World, template.HTMLEscapeString(g.Reason))
	}
	for _, s := range r.Steps {
		c := colours[int(s.World)%len(colours)]
		fmt.Fprintf(&b, `<circle class="step" cx="%.1f" cy="%.1f" r="1.8" fill="%s"><title>step %d, world %d, generation %d</title></circle>`,
			a.x(s.T), a.y(float64(s.Step)), c, s.Step, s.World, s.Generation)
	}
	for _, f := range r.Faults {
		if f.Injected.IsZero() {
			continue
		}
		x := a.x(f.Injected.Sub(r.Started).Seconds())
		fmt.Fprintf(&b, `<line class="fault" x1="%.1f" y1="10" x2="%.1f" y2="%.0f" stroke="#d62728" stroke-width="2"><title>%s</title></line>`,
			x, x, plotH-padB, template.HTMLEscapeString(fmt.Sprintf("fault %d (%s): %s", f.Index, f.Kind, f.What)))
		fmt.Fprintf(&b, `<text x="%.1f" y="22" fill="#d62728" font-size="12">%d %s</text>`, x+3, f.Index, template.HTMLEscapeString(f.Kind))
		if !f.Healed.IsZero() && f.HealWhat != "" {
			hx := a.x(f.Healed.Sub(r.Started).Seconds())
			fmt.Fprintf(&b, `<line class="heal" x1="%.1f" y1="10" x2="%.1f" y2="%.0f" stroke="#2ca02c" stroke-width="2"><title>%s</title></line>`,
				hx, hx, plotH-padB, template.HTMLEscapeString(f.HealWhat))
		}
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" text-anchor="middle">seconds from the run's start (%.1f s)</text>`, plotW/2, plotH-8, r.DurationS)
	fmt.Fprintf(&b, `<text x="14" y="%.0f" font-size="12" transform="rotate(-90 14 %.0f)" text-anchor="middle">step</text>`, plotH/2, plotH/2)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// lossSVG: the training loss of every step, by step.
func lossSVG(r *Report) template.HTML {
	var b strings.Builder
	svgOpen(&b, "loss", "training loss by step")
	if len(r.Steps) == 0 {
		b.WriteString(`</svg>`)
		return template.HTML(b.String())
	}
	a := axes{x0: 1, x1: 1, y0: 0, y1: 0}
	for _, s := range r.Steps {
		a.x1 = math.Max(a.x1, float64(s.Step))
		a.y1 = math.Max(a.y1, s.Loss)
	}
	var pts []string
	for _, s := range r.Steps {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", a.x(float64(s.Step)), a.y(s.Loss)))
	}
	fmt.Fprintf(&b, `<polyline class="loss" points="%s" fill="none" stroke="#1f77b4" stroke-width="1.5"/>`, strings.Join(pts, " "))
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="12" text-anchor="middle">step (last %d)</text>`, plotW/2, plotH-8, int(a.x1))
	fmt.Fprintf(&b, `<text x="4" y="18" font-size="12">loss (max %.3f)</text>`, a.y1)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
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
<style>
body { font-family: sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 12px 0; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; font-size: 14px; }
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
<h2>Timeline</h2>
{{.Timeline}}
<h2>Loss</h2>
{{.Loss}}
</body></html>
`))
