package job

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/hang"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/metrics"
	"github.com/phalanx-rt/phalanx/status"
	"github.com/phalanx-rt/phalanx/trace"
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

// StartMetrics makes the metrics (Config.Observe) of kind of this
// process, labelled worker="<role>-<Config.Index>", and serves them when
// Config.Metrics names an address, saying where in a Serving report.
// Readiness follows the process's reports: ready once it trains
// (Training), not once it stopped, left or failed; a parameter server's
// once it serves (psjob.RunServer). A process whose Observe is set
// already is left as it is. The returned function stops serving.
func StartMetrics(c *Config, role string, kind metrics.Process) (stop func(), err error) {
	if c.Observe != nil || c.Metrics == "" {
		return func() {}, nil
	}
	set := metrics.New(c.Job, fmt.Sprintf("%s-%d", role, c.Index), kind)
	srv, err := metrics.Serve(c.Metrics, set.Gatherer(), set.NotReady, nil)
	if err != nil {
		return nil, err
	}
	c.Observe = set
	if kind == metrics.PSServer {
		set.Ready("not serving its shards yet") // RunServer's readiness
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
// operations: its metrics and its trace (nil: neither).
func (c *Config) Observer() collective.Observer {
	switch {
	case c.Observe == nil && c.Tracer == nil:
		return nil
	case c.Tracer == nil:
		return c.Observe
	}
	return &observers{m: c.Observe, t: c.Tracer, job: c.Job}
}

// observers are a process's metrics and trace, told of each collective
// operation.
type observers struct {
	m   *metrics.Set
	t   *trace.Recorder
	job string
}

func (o *observers) OpEnded(r *collective.OpRecord) {
	o.m.OpEnded(r)
	thread := "collectives"
	if r.Group != o.job { // another group than the job's ring (a pipeline's, a feed)
		thread += " " + strings.TrimPrefix(r.Group, o.job+"/")
	}
	o.t.Span(thread, r.Op, r.Start, r.End, trace.Args{Seq: r.Seq, Generation: r.Generation, Bytes: r.Bytes,
		Algorithm: r.Algorithm, Plane: r.Plane, Rank: r.Rank, Err: r.Err})
}

// serveMetrics makes the launcher's metrics and the job's status, both
// fed by the job's events, and serves the metrics with every process's
// (LaunchConfig.Metrics) and the status page (LaunchConfig.Status).
func (j *Env) serveMetrics() error {
	lc := j.LC
	j.Metrics = metrics.New(lc.Job, "launcher", metrics.Launcher)
	j.Scraper = metrics.NewScraper(2 * time.Second)
	j.Status = status.NewModel(status.Info{Job: lc.Job, Model: lc.Model, Steps: lc.Steps}, lc.Now)
	j.hangs = &hangWatch{env: j}
	j.Events = events.Tee(j.Events, j.Metrics, launcherReadiness{j.Metrics}, j.Status, j.hangs)
	j.Procs.Tap(j.tap)
	if lc.Status != "" {
		srv, err := status.Serve(lc.Status, j.Status)
		if err != nil {
			return Invalid("Status", lc.Status, "%v", err)
		}
		j.statusAt = srv.Addr()
		fmt.Fprintf(j.Out, "status: http://%s/\n", j.statusAt)
		j.Events.Emit("status_serving", events.F("address", j.statusAt))
		j.undo = append(j.undo, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			srv.Close(ctx)
		})
	}
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
	if j.metricsAt == "" && j.statusAt == "" {
		return ""
	}
	j.spawned++
	if j.metricsAt == "" { // for the status page's figures
		host, _, _ := net.SplitHostPort(j.statusAt)
		return net.JoinHostPort(host, "0")
	}
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
	if bytes.HasPrefix(l.Text, []byte(`{"kind":"collectives"`)) {
		var c Collectives
		if err := json.Unmarshal(l.Text, &c); err != nil {
			return false
		}
		j.Events.Emit("collective_dump", events.F("worker", l.Index), events.F("rank", c.Rank), events.F("generation", c.Generation),
			events.F("reason", c.Reason), events.F("ops", c.Ops))
		j.hangs.add(hang.Dump{Worker: l.Index, Rank: c.Rank, Generation: c.Generation, Reason: c.Reason, Ops: c.Ops})
		return true
	}
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

// follow runs, while the job does, the scrapes of its processes' metrics
// into its status (every second, when they serve them) and the
// publication of its status in etcd (every publishEvery when it changed,
// and once more as the job ends).
func (j *Env) follow(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	now := j.LC.Now
	if now == nil {
		now = time.Now
	}
	go func() {
		defer close(done)
		scrape := time.NewTicker(time.Second)
		defer scrape.Stop()
		publish := time.NewTicker(publishEvery)
		defer publish.Stop()
		var published uint64
		for {
			select {
			case <-ctx.Done():
				return
			case <-scrape.C:
				if j.metricsAt != "" || j.statusAt != "" {
					fams, _ := j.Scraper.Gather() // a process that does not answer is left out
					j.Status.Scraped(fams, now())
				}
			case <-publish.C:
				published = j.publish(ctx, published)
			}
		}
	}()
	j.undo = append(j.undo, func() {
		cancel()
		<-done
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer pcancel()
		j.publish(pctx, 0) // the end
	})
}

// publishEvery is how often a launcher publishes its job's status.
const publishEvery = 2 * time.Second

// publish writes the job's status in etcd unless it is still version
// published; it returns the version written.
func (j *Env) publish(ctx context.Context, published uint64) uint64 {
	s, v := j.Status.Snapshot()
	if v == published {
		return v
	}
	b, err := json.Marshal(s.Trimmed())
	if err == nil {
		err = j.Coord.PublishStatus(ctx, b)
	}
	if err != nil {
		j.Log.Warn("publishing the job's status in etcd", zap.Error(err))
		return published
	}
	return v
}

// checkListen refuses an address no listener can take ("" is none).
func checkListen(addr string) error {
	if addr == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("port %q: want 0..65535", port)
	}
	return nil
}

// checkTrace refuses a trace file that exists (it is never overwritten)
// or whose directory does not ("" is none).
func checkTrace(path string) error {
	if path == "" {
		return nil
	}
	if _, err := os.Stat(path); err == nil {
		return errors.New("the file exists: give another name (a trace is never overwritten)")
	}
	if _, err := os.Stat(path + ".parts"); err == nil {
		return fmt.Errorf("%s.parts exists (a run that could not merge its trace?): remove it or give another name", path)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		return fmt.Errorf("its directory %s does not exist", filepath.Dir(path))
	}
	return nil
}

// startTrace makes the directory the processes record their spans in.
func (j *Env) startTrace() error {
	if j.LC.Trace == "" {
		return nil
	}
	dir := j.LC.Trace + ".parts"
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("phalanx: the trace's directory: %w", err)
	}
	j.traceParts = dir
	return nil
}

// mergeTrace joins the processes' spans into the job's trace file, and
// removes their files once it is written.
func (j *Env) mergeTrace() {
	if j.traceParts == "" {
		return
	}
	parts, err := trace.Parts(j.traceParts)
	if err == nil && len(parts) == 0 { // no process started: no trace to write
		os.RemoveAll(j.traceParts)
		return
	}
	if err == nil {
		err = writeNew(j.LC.Trace, func(w io.Writer) error {
			_, err := trace.Merge(w, parts)
			return err
		})
	}
	if err != nil {
		fmt.Fprintf(j.Out, "trace: not merged (%v); the processes' spans are in %s\n", err, j.traceParts)
		return
	}
	os.RemoveAll(j.traceParts)
	fmt.Fprintf(j.Out, "trace: %s (%d processes; open it in Perfetto or chrome://tracing)\n", j.LC.Trace, len(parts))
}

// writeNew writes a file that must not exist, whole or not at all.
func writeNew(path string, write func(io.Writer) error) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// Collectives: a rank's hang recorder (collective.Group.Recent), dumped
// when its group failed on a timeout or an abort. The launcher takes it
// from the process's lines (as Serving), emits it as a collective_dump
// event, and analyses each generation's dumps (package hang).
type Collectives struct {
	Rank       int                   `json:"rank"`
	Generation uint64                `json:"generation"`
	Reason     string                `json:"reason"`
	Ops        []collective.OpRecord `json:"ops"`
}

// ReportKind is "collectives".
func (Collectives) ReportKind() string { return "collectives" }

// Text says what failed.
func (r Collectives) Text(*Progress) string {
	return fmt.Sprintf("rank %d's collectives of generation %d failed: %s\n", r.Rank, r.Generation, r.Reason)
}

// hangGrace is how long after a generation change the launcher waits for
// the last dumps of the generation before it analyses them.
const hangGrace = 2 * time.Second

// hangWatch gathers each generation's dumps and analyses them once the
// ring has changed (and as the job ends), telling the finding in a
// hang_analysis event and a line.
type hangWatch struct {
	env      *Env
	mu       sync.Mutex
	dumps    map[uint64][]hang.Dump
	analysed map[uint64]bool
	timers   []*time.Timer
}

func (h *hangWatch) add(d hang.Dump) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dumps == nil {
		h.dumps, h.analysed = map[uint64][]hang.Dump{}, map[uint64]bool{}
	}
	h.dumps[d.Generation] = append(h.dumps[d.Generation], d)
}

// Emit watches for generations: one after a generation with dumps closes
// it.
func (h *hangWatch) Emit(event string, fields ...events.Field) error {
	if event != "generation" {
		return nil
	}
	var g uint64
	for _, f := range fields {
		if f.Key == "generation" {
			g, _ = f.Value.(uint64)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for old := range h.dumps {
		if old < g && !h.analysed[old] {
			h.timers = append(h.timers, time.AfterFunc(hangGrace, func() { h.analyse(old) }))
		}
	}
	return nil
}

// analyse tells gen's finding once.
func (h *hangWatch) analyse(gen uint64) {
	h.mu.Lock()
	if h.analysed[gen] {
		h.mu.Unlock()
		return
	}
	h.analysed[gen] = true
	dumps := h.dumps[gen]
	h.mu.Unlock()
	f, err := hang.Analyze(dumps)
	if err != nil {
		return
	}
	h.env.Events.Emit("hang_analysis", events.F("generation", f.Generation), events.F("rank", f.Rank), events.F("op", f.Op),
		events.F("seq", f.Seq), events.F("line", f.Line), events.F("dumps", len(dumps)))
	fmt.Fprintf(h.env.Out, "hang: %s\n", f.Line)
}

// flush analyses what is left, as the job ends.
func (h *hangWatch) flush() {
	h.mu.Lock()
	for _, t := range h.timers {
		t.Stop()
	}
	var gens []uint64
	for g := range h.dumps {
		if !h.analysed[g] {
			gens = append(gens, g)
		}
	}
	h.mu.Unlock()
	slices.Sort(gens)
	for _, g := range gens {
		h.analyse(g)
	}
}
