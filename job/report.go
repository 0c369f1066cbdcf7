package job

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"sync"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/worker"
)

// Report is what a worker tells of itself: one typed value per kind of
// report. The ones every kind's workers may send are here (Registered,
// Training, Checkpoint, Stopped, Left, Failed); each job kind defines its
// own beside its worker (ring.Step, psjob.Done, ...). A launched worker
// prints each as one JSON line on stdout (MarshalReport: the value's
// fields and its kind), which its launcher reads back (ReportTypes.Parse)
// and turns into the job's events (docs/events.md); RunWorker hands them
// to Config.Reports.
type Report interface {
	// ReportKind is the report's kind on the wire: "step", "ps_done", ...
	ReportKind() string
}

// An EventReport becomes one event of the job's log as it is (an
// EventReport's launcher may hold it back, or not emit it twice): its
// kind and fields, worker being the index of the process that sent it.
// The translation of reports into events is these methods, one per kind of
// report, and Emit.
type EventReport interface {
	Report
	Event(worker int) (kind string, fields []events.Field)
}

// Emit emits rep's event, if it has one, as sent by worker.
func Emit(sink events.Sink, worker int, rep Report) {
	if e, ok := rep.(EventReport); ok {
		kind, fields := e.Event(worker)
		if kind != "" {
			sink.Emit(kind, fields...)
		}
	}
}

// A TextReport is said in plain words to a person watching one worker
// (ReportText): "" says nothing.
type TextReport interface {
	Report
	Text(p *Progress) string
}

// Progress is what ReportText keeps between reports: the job's steps, the
// steps between progress lines, and the samples trained since the last.
type Progress struct {
	Steps, Every  int64
	samples, secs float64
}

// Due counts a step's samples (samplesPS over stepS seconds) and says
// whether the step's progress line is due (every Every steps and at the
// last), with the samples/s trained since the previous line (-1: none
// timed).
func (p *Progress) Due(step int64, samplesPS, stepS float64) (rate float64, due bool) {
	p.samples += samplesPS * stepS
	p.secs += stepS
	if step%max(p.Every, 1) != 0 && step != p.Steps {
		return 0, false
	}
	rate = -1
	if p.secs > 0 {
		rate = p.samples / p.secs
	}
	p.samples, p.secs = 0, 0
	return rate, true
}

// Registered: a ring worker registered with the job's coordinator.
type Registered struct {
	ID  string `json:"id"`
	Pid int    `json:"pid"`
}

// Training: a rank starts training in a generation's ring (every rank).
type Training struct {
	Generation uint64 `json:"generation"`
	World      int    `json:"world"`
	Rank       int    `json:"rank"`
	Step       int64  `json:"step"` // the step it trains after
}

// Checkpoint: a checkpoint was saved, failed, skipped or restored (Step is
// Checkpoint.Step).
type Checkpoint struct {
	Step       int64            `json:"step"`
	Checkpoint checkpoint.Event `json:"checkpoint"`
}

// Stopped: the job stopped at Step (below its minimum of workers, or on
// request), after its final checkpoint.
type Stopped struct {
	Step       int64  `json:"step"`
	Generation uint64 `json:"generation"`
	World      int    `json:"world"`
}

// Left: a worker left the job on request; the others go on.
type Left struct {
	ID  string `json:"id"`
	Pid int    `json:"pid"`
}

// Failed is a worker's last word: why it failed. NonFinite is a step
// whose reduced gradients or loss were not finite: every rank of the ring
// fails it.
type Failed struct {
	Reason    string                 `json:"reason"`
	NonFinite *worker.NonFiniteError `json:"non_finite,omitempty"`
}

// ReportKind is "registered".
func (Registered) ReportKind() string { return "registered" }

// ReportKind is "training".
func (Training) ReportKind() string { return "training" }

// ReportKind is "checkpoint".
func (Checkpoint) ReportKind() string { return "checkpoint" }

// ReportKind is "stopped".
func (Stopped) ReportKind() string { return "stopped" }

// ReportKind is "left".
func (Left) ReportKind() string { return "left" }

// ReportKind is "failed".
func (Failed) ReportKind() string { return "failed" }

// Event is checkpoint_saved, _failed, _skipped or _restored.
func (r Checkpoint) Event(int) (string, []events.Field) {
	e := &r.Checkpoint
	switch e.Kind {
	case "saved":
		return "checkpoint_saved", []events.Field{events.F("step", e.Step), events.F("bytes", e.Bytes), events.F("seconds", e.Seconds),
			events.F("url", e.URL), events.F("world", e.WorldAfter), events.F("checkpoint", e.ID), events.F("manifest_crc32c", e.ManifestCRC)}
	case "failed":
		return "checkpoint_failed", []events.Field{events.F("step", e.Step), events.F("checkpoint", e.ID), events.F("error", e.Err)}
	case "skipped":
		return "checkpoint_skipped", []events.Field{events.F("checkpoint", e.ID), events.F("error", e.Err)}
	case "restored":
		return "checkpoint_restored", []events.Field{events.F("step", e.Step), events.F("world_before", e.WorldBefore),
			events.F("world_after", e.WorldAfter), events.F("url", e.URL), events.F("bytes", e.Bytes), events.F("config_changed", e.ConfigChanged)}
	}
	return "", nil
}

// Event is stopped.
func (r Stopped) Event(int) (string, []events.Field) {
	return "stopped", []events.Field{events.F("step", r.Step), events.F("generation", r.Generation), events.F("world", r.World)}
}

// Event is worker_failed.
func (r Failed) Event(worker int) (string, []events.Field) {
	return "worker_failed", []events.Field{events.F("worker", worker), events.F("reason", r.Reason), events.F("non_finite", r.NonFinite)}
}

// Text says what the worker registered as.
func (r Registered) Text(*Progress) string {
	return fmt.Sprintf("registered as %s (pid %d); waiting for a ring\n", r.ID, r.Pid)
}

// Text is the checkpoint's line (CheckpointText).
func (r Checkpoint) Text(*Progress) string { return CheckpointText(&r.Checkpoint) }

// Text says where the job stopped.
func (r Stopped) Text(*Progress) string { return fmt.Sprintf("the job stopped at step %d\n", r.Step) }

// Text says the worker left.
func (Left) Text(*Progress) string { return "left the job; the others go on\n" }

// Text says why the worker failed.
func (r Failed) Text(*Progress) string { return fmt.Sprintf("failed: %s\n", r.Reason) }

// ReportTypes reads report lines back into typed reports: the common
// kinds and those of one job kind.
type ReportTypes map[string]reflect.Type

// NewReportTypes reads the common reports and the kinds of protos (each a
// report value of its type, usually the zero value).
func NewReportTypes(protos ...Report) ReportTypes {
	t := ReportTypes{}
	for _, p := range append([]Report{Registered{}, Training{}, Checkpoint{}, Stopped{}, Left{}, Failed{}, Serving{}}, protos...) {
		t[p.ReportKind()] = reflect.TypeOf(p)
	}
	return t
}

// Parse reads a launched process's report line; anything else it printed
// on stdout, or a report of a kind t does not know, is an error naming the
// process.
func (t ReportTypes) Parse(l launch.Line) (Report, error) {
	var head struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(l.Text, &head); err != nil {
		return nil, fmt.Errorf("phalanx: %s %d printed %q, not a report: %w", l.Role, l.Index, l.Text, err)
	}
	typ, ok := t[head.Kind]
	if !ok {
		return nil, fmt.Errorf("phalanx: %s %d printed a report of unknown kind %q: %q", l.Role, l.Index, head.Kind, l.Text)
	}
	v := reflect.New(typ)
	if err := json.Unmarshal(l.Text, v.Interface()); err != nil {
		return nil, fmt.Errorf("phalanx: %s %d printed a malformed %s report %q: %w", l.Role, l.Index, head.Kind, l.Text, err)
	}
	return v.Elem().Interface().(Report), nil
}

// MarshalReport is r as a launched worker prints it: one JSON object of
// its kind ("kind") and its fields.
func MarshalReport(r Report) ([]byte, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("phalanx: a %s report: %w", r.ReportKind(), err)
	}
	if len(body) < 2 || body[0] != '{' {
		return nil, fmt.Errorf("phalanx: a %s report is %s, not a JSON object", r.ReportKind(), body)
	}
	kind, _ := json.Marshal(r.ReportKind())
	out := append([]byte(`{"kind":`), kind...)
	if len(body) > 2 {
		out = append(out, ',')
	}
	return append(out, body[1:]...), nil
}

// Reporter hands reports to Config.Reports, one at a time.
type Reporter struct {
	mu sync.Mutex
	f  func(Report)
}

// NewReporter hands reports to f (nil: none).
func NewReporter(f func(Report)) *Reporter { return &Reporter{f: f} }

// Send hands rep over.
func (r *Reporter) Send(rep Report) {
	if r.f == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.f(rep)
}

// ReportLines writes reports as JSON lines to w (MarshalReport): how a
// launched worker tells its launcher (for Config.Reports).
func ReportLines(w io.Writer) func(Report) {
	return func(r Report) {
		b, err := MarshalReport(r)
		if err != nil {
			b, _ = MarshalReport(Failed{Reason: err.Error()})
		}
		w.Write(append(b, '\n'))
	}
}

// ReportText writes reports as plain lines to w, for a person watching one
// worker (phalanx worker without --json): each TextReport's Text, a
// step's every every steps of the job's steps (rank 0 alone reports steps;
// samples/s is what was trained since the previous line).
func ReportText(w io.Writer, steps, every int64) func(Report) {
	p := &Progress{Steps: steps, Every: max(every, 1)}
	return func(r Report) {
		if t, ok := r.(TextReport); ok {
			io.WriteString(w, t.Text(p))
		}
	}
}
