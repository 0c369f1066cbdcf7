package job

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/worker"
)

// fakeKind is a kind for the registry's tests: a name, the models it owns
// and its roles.
type fakeKind struct {
	name  string
	owns  func(ModelSpec) bool
	roles []string
}

func (k fakeKind) Name() string { return k.name }
func (k fakeKind) Owns(s ModelSpec, _ *Config) bool {
	return k.owns != nil && k.owns(s)
}
func (k fakeKind) Prepare(context.Context, *LaunchConfig, ModelSpec, Options) (Job, error) {
	return nil, nil
}
func (k fakeKind) Worker() string { return k.roles[0] }
func (k fakeKind) Roles() map[string]Role {
	m := map[string]Role{}
	for _, r := range k.roles {
		m[r] = func(context.Context, Config, *Registry) (*Result, error) { return &Result{Step: int64(len(r))}, nil }
	}
	return m
}

func TestRegistryKinds(t *testing.T) {
	ring := fakeKind{name: "ring", owns: func(s ModelSpec) bool { return s.New != nil }, roles: []string{"worker"}}
	ps := fakeKind{name: "ps", owns: func(s ModelSpec) bool { return s.PS != nil }, roles: []string{"ps-server", "ps-worker"}}
	newTask := func(Options, uint64) (Task, error) { return Task{}, nil }
	reg := NewRegistry([]Kind{ring, ps}, ModelSpec{Name: "lin", New: newTask}, ModelSpec{Name: "lr", PS: &PSModel{}},
		ModelSpec{Name: "pipe", Kind: "pipeline"})

	cases := []struct {
		model, kind, err string
	}{
		{"lin", "ring", ""},
		{"lr", "ps", ""},
		{"pipe", "", `model pipe is of kind "pipeline", which is not registered (kinds: [ring ps])`},
	}
	for _, tc := range cases {
		spec, err := reg.Lookup(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		k, err := reg.KindOf(spec, &Config{})
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: KindOf: %v, want an error saying %q", tc.model, err, tc.err)
		case tc.err == "" && (err != nil || k.Name() != tc.kind):
			t.Errorf("%s: KindOf: %v, %v; want kind %s", tc.model, k, err, tc.kind)
		}
	}
	if err := reg.AddKind(fakeKind{name: "pipeline", roles: []string{"stage"}}); err != nil {
		t.Fatal(err)
	}
	if spec, _ := reg.Lookup("pipe"); true {
		if k, err := reg.KindOf(spec, &Config{}); err != nil || k.Name() != "pipeline" {
			t.Errorf("once added, KindOf(pipe): %v, %v; want pipeline", k, err)
		}
	}
	if r, ok := reg.Role("stage"); !ok || r == nil {
		t.Error("the added kind's role is not dispatched")
	}
	for _, bad := range []struct {
		k    Kind
		want string
	}{
		{fakeKind{name: "ring", roles: []string{"other"}}, `job kind "ring" registered twice`},
		{fakeKind{name: "tp", roles: []string{"ps-worker"}}, `job kind "tp": role "ps-worker" is kind "ps"'s`},
	} {
		if err := reg.AddKind(bad.k); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("AddKind(%s): %v, want %q", bad.k.Name(), err, bad.want)
		}
	}
}

func TestNewRegistryRefusesAModelOfNoKind(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "want exactly one of New and PS") {
			t.Fatalf("NewRegistry of a model with neither New, PS nor Kind: panic %v", v)
		}
	}()
	NewRegistry(nil, ModelSpec{Name: "nothing"})
}

// TestRunModelDispatches: RunModel runs a model's kind's worker role.
func TestRunModelDispatches(t *testing.T) {
	reg := NewRegistry([]Kind{fakeKind{name: "pipeline", roles: []string{"stage-worker"}}}, ModelSpec{Name: "pipe", Kind: "pipeline"})
	cfg := DefaultConfig()
	cfg.Model = "pipe"
	res, err := RunModel(testwait.Context(t, time.Minute), cfg, reg)
	if err != nil || res == nil || res.Step != int64(len("stage-worker")) {
		t.Fatalf("RunModel: %+v, %v; want the kind's worker role run", res, err)
	}
}

func TestExitStatus(t *testing.T) {
	nf := &worker.NonFiniteError{Step: 7, Param: "w", Index: 1}
	cases := []struct {
		name   string
		err    error
		status int
		report string // the last report's JSON, "" for none
	}{
		{"done", nil, 0, ""},
		{"left", ErrLeft, 0, ""},
		{"stopped", &elastic.StoppedError{Reason: "too few"}, ExitStopped, ""},
		{"failed", errors.New("boom"), 1, `{"kind":"failed","reason":"boom"}`},
		{"non-finite", fmt.Errorf("round: %w", nf), 1, `{"kind":"failed","reason":"round: worker: step 7: gradient of parameter w is not finite (element 1)","non_finite":{"step":7,"param":"w","index":1}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var reps []Report
			if got := exitStatus(tc.err, zap.NewNop(), func(r Report) { reps = append(reps, r) }); got != tc.status {
				t.Errorf("status %d, want %d", got, tc.status)
			}
			switch {
			case tc.report == "" && len(reps) > 0:
				t.Errorf("reported %+v, want nothing", reps)
			case tc.report != "":
				if len(reps) != 1 {
					t.Fatalf("reported %+v, want one report", reps)
				}
				var want, got map[string]any
				b, _ := MarshalReport(reps[0])
				json.Unmarshal(b, &got)
				json.Unmarshal([]byte(tc.report), &want)
				for k, v := range want {
					if fmt.Sprint(got[k]) != fmt.Sprint(v) {
						t.Errorf("report's %s: %v, want %v (report %s)", k, got[k], v, b)
					}
				}
			}
		})
	}
}

func TestRunProcessRefusesABadSpec(t *testing.T) {
	var out, errOut bytes.Buffer
	if got := RunProcess("{not json", NewRegistry(nil), nil, &out, &errOut); got != 2 || !strings.Contains(errOut.String(), "PHALANX_WORKER is not a process spec") {
		t.Errorf("a spec that is not JSON: status %d, stderr %q; want 2 naming the variable", got, errOut.String())
	}
	out.Reset()
	if got := RunProcess(`{"role":"juggler","log_level":"error"}`, NewRegistry(nil), nil, &out, &errOut); got != 1 ||
		!strings.Contains(out.String(), `unknown process role \"juggler\"`) {
		t.Errorf("an unknown role: status %d, stdout %q; want 1 and a failed report naming the role", got, out.String())
	}
}

// stepReport stands for a job kind's own report.
type stepReport struct {
	Step int64 `json:"step"`
}

func (stepReport) ReportKind() string { return "step" }

// TestReportLines: every report, as a launched worker prints it, reads
// back as the same typed value; a line that is no report, one of a kind
// the launcher does not know and a malformed one are errors naming the
// process.
func TestReportLines(t *testing.T) {
	types := NewReportTypes(stepReport{})
	nf := &worker.NonFiniteError{Step: 7, Param: "w", Index: 1}
	for _, rep := range []Report{
		Registered{ID: "w-1", Pid: 42}, Training{Generation: 3, World: 2, Rank: 1, Step: 9},
		Checkpoint{Step: 7, Checkpoint: checkpoint.Event{Kind: "saved", ID: "step-7", Step: 7, Bytes: 10}},
		Stopped{Step: 5, Generation: 2, World: 1}, Left{ID: "w-2", Pid: 43}, Failed{Reason: "boom", NonFinite: nf}, stepReport{Step: 4},
	} {
		var buf bytes.Buffer
		ReportLines(&buf)(rep)
		line := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if bytes.Contains(line, []byte("\n")) || !bytes.HasPrefix(line, []byte(`{"kind":"`+rep.ReportKind()+`"`)) {
			t.Errorf("%T printed %q: want one line starting with its kind", rep, buf.String())
		}
		got, err := types.Parse(launch.Line{Role: "worker", Index: 1, Text: line})
		if err != nil || !reflect.DeepEqual(got, rep) {
			t.Errorf("%s read back as %#v, %v; want %#v", line, got, err, rep)
		}
	}
	for _, tc := range []struct{ text, want string }{
		{"hello", `worker 3 printed "hello", not a report`},
		{`{"kind":"juggle","step":4}`, `worker 3 printed a report of unknown kind "juggle"`},
		{`{"kind":"step","step":"four"}`, `worker 3 printed a malformed step report`},
	} {
		if _, err := types.Parse(launch.Line{Role: "worker", Index: 3, Text: []byte(tc.text)}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.text, err, tc.want)
		}
	}
}

// TestReportEvents: the common reports' events and plain lines.
func TestReportEvents(t *testing.T) {
	cases := []struct {
		rep         Report
		event, text string
	}{
		{Registered{ID: "w-1", Pid: 42}, "", "registered as w-1 (pid 42); waiting for a ring\n"},
		{Training{Generation: 1}, "", ""},
		{Checkpoint{Step: 7, Checkpoint: checkpoint.Event{Kind: "saved", ID: "step-7", URL: "/c/step-7", Step: 7, Bytes: 2048, Seconds: 0.5, WorldAfter: 2}},
			"checkpoint_saved step=7 bytes=2048 seconds=0.5 url=/c/step-7 world=2 checkpoint=step-7 manifest_crc32c=0",
			"checkpoint of step 7 saved: /c/step-7 (2.0 KiB in 0.50s)\n"},
		{Checkpoint{Checkpoint: checkpoint.Event{Kind: "skipped", ID: "step-9", Err: "damaged"}}, "checkpoint_skipped checkpoint=step-9 error=damaged",
			"checkpoint step-9 skipped: damaged\n"},
		{Stopped{Step: 5, Generation: 2, World: 1}, "stopped step=5 generation=2 world=1", "the job stopped at step 5\n"},
		{Left{ID: "w-2"}, "", "left the job; the others go on\n"},
		{Failed{Reason: "boom"}, "worker_failed worker=3 reason=boom non_finite=<nil>", "failed: boom\n"},
	}
	for _, tc := range cases {
		var ev sink
		Emit(&ev, 3, tc.rep)
		if got := strings.Join(ev.lines, "\n"); got != tc.event {
			t.Errorf("%T's event: %q, want %q", tc.rep, got, tc.event)
		}
		var out bytes.Buffer
		ReportText(&out, 10, 1)(tc.rep)
		if out.String() != tc.text {
			t.Errorf("%T's text: %q, want %q", tc.rep, out.String(), tc.text)
		}
	}
}

// TestProgressDue: a progress line every Every steps and at the last, its
// samples/s over the steps since the previous line.
func TestProgressDue(t *testing.T) {
	p := &Progress{Steps: 7, Every: 3}
	var lines []string
	for step := int64(1); step <= 7; step++ {
		if rate, due := p.Due(step, float64(100*step), 0.5); due {
			lines = append(lines, fmt.Sprintf("%d:%.0f", step, rate))
		}
	}
	// steps 1-3 trained 50+100+150 samples in 1.5 s; 4-6 200+250+300; 7 350 in 0.5 s.
	if got := strings.Join(lines, " "); got != "3:200 6:500 7:700" {
		t.Errorf("lines %s, want 3:200 6:500 7:700", got)
	}
}

// sink records events as "name key=value ..." lines.
type sink struct{ lines []string }

func (s *sink) Emit(event string, fields ...events.Field) error {
	parts := []string{event}
	for _, f := range fields {
		parts = append(parts, fmt.Sprintf("%s=%v", f.Key, f.Value))
	}
	s.lines = append(s.lines, strings.Join(parts, " "))
	return nil
}

func TestGenerationEvents(t *testing.T) {
	g := &phalanxpb.Generation{Number: 3, Reason: "lost a", DecidedBy: "c",
		Members:    []*phalanxpb.Member{{Id: "b", Pid: 2}, {Id: "n", Pid: 9}},
		Lost:       []*phalanxpb.LostMember{{Id: "a", Pid: 1, Rank: 0, DetectedBy: "lease"}, {Id: "l", Pid: 5, Rank: 2, Left: true}},
		Joined:     []string{"n"},
		Readmitted: []string{"b"},
	}
	var s sink
	GenerationEvents(&s, g, 1)
	want := []string{
		"generation generation=3 members=[map[id:b pid:2 rank:0] map[id:n pid:9 rank:1]] world=2 reason=lost a decided_by=c",
		"worker_lost generation=3 rank=0 pid=1 id=a detected_by=lease",
		"worker_left generation=3 rank=2 pid=5 id=l detected_by=",
		"straggler_readmitted generation=3 rank=0 pid=2 id=b",
		"worker_joined generation=3 rank=1 pid=9 id=n",
	}
	if strings.Join(s.lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("events\n%s\nwant\n%s", strings.Join(s.lines, "\n"), strings.Join(want, "\n"))
	}
	s.lines = nil
	GenerationEvents(&s, g, 3) // the first generation: nobody joined it
	if strings.Contains(strings.Join(s.lines, "\n"), "worker_joined") {
		t.Errorf("the first generation's members said to join: %v", s.lines)
	}
}

func TestConfigErrorValueText(t *testing.T) {
	cases := []struct {
		value any
		want  string
	}{{"", `""`}, {"loud", "loud"}, {0, "0"}, {[]string(nil), "[]"}, {Options{"a": "1"}, "map[a:1]"}}
	for _, tc := range cases {
		e := &ConfigError{Field: "F", Value: tc.value, Reason: "bad"}
		if got := e.ValueText(); got != tc.want {
			t.Errorf("ValueText(%#v) = %q, want %q", tc.value, got, tc.want)
		}
		if want := "phalanx: F " + tc.want + ": bad"; e.Error() != want {
			t.Errorf("Error() = %q, want %q", e.Error(), want)
		}
	}
}
