package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Modes of a pass.
const (
	// ModeFull is the pass that runs every test: a reduced pass's skip is
	// allowed under CI only for a test this pass ran and passed.
	ModeFull = "full"
	// ModeReduced is a pass under -race or -short, which skip what they
	// cannot run meaningfully.
	ModeReduced = "reduced"
)

// Actions of a Result: test2json's pass, fail and skip, and ours.
const (
	ActionPass       = "pass"
	ActionFail       = "fail"
	ActionSkip       = "skip"
	ActionUnfinished = "unfinished" // the test binary crashed or timed out while it ran
	ActionBuildFail  = "build-fail" // a package's test binary did not build (Package is its import path)
	ActionExit       = "exit"       // go test's exit status for a pass (Status)
)

// Result is one test's or package's outcome in one pass; a package's has no
// Test.
type Result struct {
	Pass    string  `json:"pass"`
	Mode    string  `json:"mode,omitempty"`
	Package string  `json:"package,omitempty"`
	Test    string  `json:"test,omitempty"`
	Action  string  `json:"action"`
	Reason  string  `json:"reason,omitempty"` // a skip's message, or why a test did not finish
	Elapsed float64 `json:"elapsed,omitempty"`
	Status  int     `json:"status,omitempty"` // ActionExit only
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	Elapsed     float64
	ImportPath  string // build-output, build-fail
	FailedBuild string
}

// testState is what a test printed while it ran; it is printed only if
// the test fails or does not finish.
type testState struct {
	lines []string
	done  bool
}

type pkgState struct {
	tests map[string]*testState
	order []string // tests in the order they started
	// stray is output attributed to a test that had already ended: a
	// panic on another goroutine, or a parallel test's crash, lands there.
	stray []string
	// panic is the first "panic:" line the package's tests printed (a
	// crash, or "panic: test timed out after 20m0s").
	panic string
	done  bool
}

// Recorder reads one pass's `go test -json`, echoes it as plain go test
// would print it and keeps its results.
type Recorder struct {
	pass, mode string
	out        io.Writer
	pkgs       map[string]*pkgState
	pkgOrder   []string
	results    []Result
}

// NewRecorder returns a Recorder for the pass that echoes to out.
func NewRecorder(pass, mode string, out io.Writer) *Recorder {
	return &Recorder{pass: pass, mode: mode, out: out, pkgs: map[string]*pkgState{}}
}

// Read consumes a `go test -json` stream to its end. A line that is not an
// event (the go command's own messages) is echoed as it is.
func (r *Recorder) Read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 64<<20)
	for sc.Scan() {
		r.line(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading go test -json: %w", err)
	}
	r.finish()
	return nil
}

// line handles one line of `go test -json`.
func (r *Recorder) line(line []byte) {
	var e event
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
		fmt.Fprintf(r.out, "%s\n", line)
		return
	}
	r.handle(e)
}

// finish ends every package the stream left open.
func (r *Recorder) finish() {
	for _, name := range r.pkgOrder {
		if p := r.pkgs[name]; !p.done {
			r.endPackage(name, p, ActionUnfinished, 0)
			fmt.Fprintf(r.out, "FAIL\t%s: the stream ended before the package did\n", name)
		}
	}
}

func (r *Recorder) pkg(name string) *pkgState {
	p := r.pkgs[name]
	if p == nil {
		p = &pkgState{tests: map[string]*testState{}}
		r.pkgs[name] = p
		r.pkgOrder = append(r.pkgOrder, name)
	}
	return p
}

func (p *pkgState) test(name string) *testState {
	t := p.tests[name]
	if t == nil {
		t = &testState{}
		p.tests[name] = t
		p.order = append(p.order, name)
	}
	return t
}

func (r *Recorder) handle(e event) {
	switch e.Action {
	case "build-output":
		io.WriteString(r.out, e.Output)
		return
	case "build-fail":
		r.add(Result{Package: e.ImportPath, Action: ActionBuildFail})
		return
	}
	if e.Package == "" {
		return
	}
	p := r.pkg(e.Package)
	if e.Test == "" {
		switch e.Action {
		case "output":
			if e.Output == "PASS\n" { // plain go test does not print it for a package that passed
				return
			}
			if strings.HasPrefix(e.Output, "FAIL") {
				r.flushPending(p)
			}
			io.WriteString(r.out, e.Output)
		case ActionPass, ActionFail, ActionSkip:
			r.endPackage(e.Package, p, e.Action, e.Elapsed)
		}
		return
	}
	t := p.test(e.Test)
	switch e.Action {
	case "output":
		if p.panic == "" && strings.HasPrefix(e.Output, "panic: ") {
			p.panic = strings.TrimSpace(e.Output)
		}
		if t.done {
			p.stray = append(p.stray, e.Output)
		} else {
			t.lines = append(t.lines, e.Output)
		}
	case ActionPass, ActionSkip, ActionFail:
		t.done = true
		res := Result{Package: e.Package, Test: e.Test, Action: e.Action, Elapsed: e.Elapsed}
		switch e.Action {
		case ActionPass, ActionSkip:
			// test2json may send a test's end after output that followed
			// its "--- PASS" line: another test's crash, kept as stray.
			for i := len(t.lines) - 1; i >= 0; i-- {
				if l := strings.TrimLeft(t.lines[i], " "); strings.HasPrefix(l, "--- PASS") || strings.HasPrefix(l, "--- SKIP") {
					p.stray = append(p.stray, t.lines[i+1:]...)
					t.lines = t.lines[:i]
					break
				}
			}
			if e.Action == ActionSkip {
				res.Reason = skipReason(t.lines)
			}
		case ActionFail:
			printLines(r.out, t.lines)
		}
		t.lines = nil
		r.add(res)
	}
}

// flushPending prints what the package's unfinished tests printed and any
// stray output: the trace of a crash or a timeout is there.
func (r *Recorder) flushPending(p *pkgState) {
	for _, name := range p.order {
		if t := p.tests[name]; !t.done {
			printLines(r.out, t.lines)
			t.lines = nil
		}
	}
	printLines(r.out, p.stray)
	p.stray = nil
}

func (r *Recorder) endPackage(name string, p *pkgState, action string, elapsed float64) {
	if p.done {
		return
	}
	if action != ActionPass && action != ActionSkip {
		r.flushPending(p)
	}
	p.done = true
	var unfinished []string
	for _, tn := range p.order {
		if t := p.tests[tn]; !t.done {
			unfinished = append(unfinished, tn)
		}
	}
	reason := crashReason(p)
	for _, tn := range unfinished {
		t := p.tests[tn]
		t.done = true
		r.add(Result{Package: name, Test: tn, Action: ActionUnfinished, Reason: reason})
	}
	if len(unfinished) > 0 && action == ActionPass {
		action = ActionFail // a package whose tests did not all end did not pass
	}
	r.add(Result{Package: name, Action: action, Elapsed: elapsed})
}

func (r *Recorder) add(res Result) {
	res.Pass, res.Mode = r.pass, r.mode
	r.results = append(r.results, res)
}

// crashReason says why a package's tests did not finish.
func crashReason(p *pkgState) string {
	if p.panic != "" {
		return p.panic
	}
	return "the test binary exited while the test ran (its output is above)"
}

// isFraming tells the lines test2json's -v framing adds from a test's own.
func isFraming(line string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS", "--- SKIP"} {
		if strings.HasPrefix(strings.TrimLeft(line, " "), p) {
			return true
		}
	}
	return false
}

func printLines(out io.Writer, lines []string) {
	for _, l := range lines {
		if !isFraming(l) {
			io.WriteString(out, l)
		}
	}
}

// skipReason is the last line the test printed before its SKIP line: the
// message of t.Skip, or its last log if it skipped with t.SkipNow.
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" && !isFraming(lines[i]) {
			return l
		}
	}
	return "(no reason given)"
}

// Results are the pass's results so far.
func (r *Recorder) Results() []Result { return r.results }

// Failed says whether any test or package failed or did not finish.
func (r *Recorder) Failed() bool {
	for _, res := range r.results {
		if isFailure(res) {
			return true
		}
	}
	return false
}

func isFailure(res Result) bool {
	switch res.Action {
	case ActionFail, ActionUnfinished, ActionBuildFail:
		return true
	case ActionExit:
		return res.Status != 0
	}
	return false
}

// Line is the pass's one-line count.
func (r *Recorder) Line() string {
	var c counts
	for _, res := range r.results {
		c.add(res)
	}
	return fmt.Sprintf("== %s: %s", r.pass, c)
}
