package job

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/metrics"
)

// Serving: a process serves its metrics, /healthz and /readyz at Metrics
// (Config.Metrics). The launcher scrapes it for the job's one endpoint.
type Serving struct {
	Metrics string `json:"metrics"`
}

// ReportKind is "serving".
func (Serving) ReportKind() string { return "serving" }

// Text says where.
func (r Serving) Text(*Progress) string {
	return fmt.Sprintf("metrics: http://%s/metrics\n", r.Metrics)
}

// StartMetrics makes this process's metrics (Config.Observe) of kind, and
// serves them when Config.Metrics names an address, saying where in a
// Serving report. Readiness follows the process's reports: ready once it
// trains (Training; a parameter server once it serves), not once it
// stopped, left or failed. A process whose Observe is set already is left
// as it is. The returned function stops serving.
func StartMetrics(c *Config, kind metrics.Process) (stop func(), err error) {
	if c.Observe != nil || c.Metrics == "" {
		return func() {}, nil
	}
	set := metrics.New(c.Job, strconv.Itoa(c.Index), kind)
	srv, err := metrics.Serve(c.Metrics, set.Gatherer(), set.NotReady, nil)
	if err != nil {
		return nil, err
	}
	c.Observe = set
	if kind == metrics.PSServer {
		set.Ready("")
	}
	next := c.Reports
	c.Reports = func(r Report) {
		switch r.(type) {
		case Training:
			set.Ready("")
		case Stopped:
			set.Ready("the job stopped")
		case Left:
			set.Ready("left the job")
		case Failed:
			set.Ready("failed")
		}
		if next != nil {
			next(r)
		}
	}
	if next != nil {
		next(Serving{Metrics: srv.Addr()})
	}
	log := c.Logger
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil && log != nil {
			log.Warn("stopping the metrics server", zap.Error(err))
		}
	}, nil
}

// Observer is what the process's collective groups tell of their
// operations (its metrics; nil: nothing).
func (c *Config) Observer() collective.Observer {
	if c.Observe == nil {
		return nil
	}
	return c.Observe
}

// serveMetrics makes the launcher's metrics, fed by the job's events, and
// serves them with every process's (LaunchConfig.Metrics).
func (j *Env) serveMetrics() error {
	lc := j.LC
	j.Metrics = metrics.New(lc.Job, "launcher", metrics.Launcher)
	j.Scraper = metrics.NewScraper(2 * time.Second)
	j.Events = events.Tee(j.Events, j.Metrics, launcherReadiness{j.Metrics})
	j.Procs.Tap(j.tap)
	if lc.Metrics == "" {
		return nil
	}
	srv, err := metrics.Serve(lc.Metrics, prometheus.Gatherers{j.Metrics.Gatherer(), j.Scraper}, j.Metrics.NotReady, nil)
	if err != nil {
		return Invalid("Metrics", lc.Metrics, "%v", err)
	}
	j.metricsAt = srv.Addr()
	fmt.Fprintf(j.Out, "metrics: http://%s/metrics\n", j.metricsAt)
	j.Events.Emit("metrics_serving", events.F("process", "launcher"), events.F("address", j.metricsAt))
	j.undo = append(j.undo, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Close(ctx)
	})
	return nil
}

// processMetrics is the address the next process started serves its
// metrics on: the launcher's host, on the launcher's port + 1, + 2, ...
// in the order they start, or each on a port of its own choosing when
// the launcher's was chosen so ("" : no metrics).
func (j *Env) processMetrics() string {
	if j.metricsAt == "" {
		return ""
	}
	j.spawned++
	host, port, _ := net.SplitHostPort(j.LC.Metrics)
	p, _ := strconv.Atoi(port)
	if p == 0 {
		return net.JoinHostPort(host, "0")
	}
	return net.JoinHostPort(host, strconv.Itoa(p+j.spawned))
}

// tap takes a process's Serving report from its lines before its kind
// sees them: the job's endpoint scrapes it from now on.
func (j *Env) tap(l launch.Line) bool {
	if !bytes.HasPrefix(l.Text, []byte(`{"kind":"serving"`)) {
		return false
	}
	var s Serving
	if err := json.Unmarshal(l.Text, &s); err != nil || s.Metrics == "" {
		return false
	}
	name := fmt.Sprintf("%s-%d", l.Role, l.Index)
	j.Scraper.Set(name, s.Metrics)
	j.Events.Emit("metrics_serving", events.F("process", name), events.F("address", s.Metrics))
	fmt.Fprintf(j.Out, "%s %d metrics: http://%s/metrics\n", l.Role, l.Index, s.Metrics)
	return true
}

// launcherReadiness: a launcher is ready once its job has a ring, and no
// longer once the job was stopped.
type launcherReadiness struct{ m *metrics.Set }

func (r launcherReadiness) Emit(event string, fields ...events.Field) error {
	switch event {
	case "job_started":
		r.m.Ready("waiting for the first generation")
	case "generation":
		for _, f := range fields {
			if f.Key == "world" {
				if w, _ := f.Value.(int); w > 0 {
					r.m.Ready("")
				} else {
					r.m.Ready("the job was stopped")
				}
			}
		}
	case "stopped", "done":
		r.m.Ready("the job ended")
	}
	return nil
}
