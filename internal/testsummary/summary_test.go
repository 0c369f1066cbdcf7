package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The testdata streams are `go test -json` (*.jsonl, Time fields dropped)
// and `go test -v` (*.txt) as Go 1.26 wrote them for small packages made to
// pass, skip, fail, panic in a parallel test, time out (-timeout 3s),
// os.Exit mid-test, fail vet and fail to build.

// TestRecord: each recorded stream gives the results it holds, prints the
// output of failed and unfinished tests and package lines only, and fails
// when any test or package did.
func TestRecord(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  string // a testdata file, or lines of its own
		results []string
		echo    []string // lines the echo must hold
		silent  []string // ... and must not
		failed  bool
	}{
		{
			name:   "mixed.jsonl",
			stream: "mixed.jsonl",
			results: []string{
				"t2j/exit TestExit unfinished: the test binary exited while the test ran (its output is above)",
				"t2j/exit  fail", "t2j/none  skip",
				"t2j/ok TestA pass", "t2j/ok TestRace skip: ok_test.go:4: the race detector allocates", "t2j/ok  pass",
				"t2j/vet [t2j/vet.test]  build-fail", "t2j/vet  fail",
			},
			echo: []string{"    exit_test.go:3: about to die", "FAIL\tt2j/exit\t0.008s", "?   \tt2j/none\t[no test files]",
				"ok  \tt2j/ok\t0.012s", `fmt.Printf format %d has arg "s" of wrong type string`, "FAIL\tt2j/vet [build failed]"},
			silent: []string{"noise", "=== RUN", "--- PASS", "PASS\n", "the race detector allocates"},
			failed: true,
		},
		{
			name:   "failures.jsonl",
			stream: "failures.jsonl",
			results: []string{
				"t2j/a TestPass pass", "t2j/a TestSkip skip: a_test.go:4: no reason here", "t2j/a TestSub/x skip: a_test.go:5: sub skip 1",
				"t2j/a TestSub/y fail", "t2j/a TestSub fail", "t2j/a  fail",
				"t2j/b TestOK pass", "t2j/b TestPanic fail", "t2j/b TestOther pass", "t2j/b  fail",
				"t2j/d [t2j/d.test]  build-fail", "t2j/d  fail",
				"t2j/c TestHang unfinished: panic: test timed out after 3s", "t2j/c  fail",
			},
			echo: []string{"    a_test.go:5: bad y", "--- FAIL: TestSub/y", "FAIL\tt2j/a\t0.006s",
				"--- FAIL: TestPanic", "panic: boom [recovered, repanicked]", "t2j/b.TestPanic(", "FAIL\tt2j/b",
				"d/d_test.go:3:28: undefined: undefined",
				"panic: test timed out after 3s", "\t\tTestHang (3s)", "t2j/c.TestHang(", "FAIL\tt2j/c\t3.025s"},
			silent: []string{"hello", "no reason here", "sub skip 1", "=== RUN", "=== CONT"},
			failed: true,
		},
		{
			name:   "mixed.txt (go test -v, converted a package at a time)",
			stream: "mixed.txt",
			results: []string{
				"t2j/exit TestExit unfinished: the test binary exited while the test ran (its output is above)",
				"t2j/exit  fail", "t2j/none  skip",
				"t2j/ok TestA pass", "t2j/ok TestRace skip: ok_test.go:4: the race detector allocates", "t2j/ok  pass",
				"t2j/vet  fail",
			},
			echo: []string{"    exit_test.go:3: about to die", "FAIL\tt2j/exit\t0.004s", "?   \tt2j/none\t[no test files]",
				"ok  \tt2j/ok\t0.015s", `fmt.Printf format %d has arg "s" of wrong type string`, "FAIL\tt2j/vet [build failed]"},
			silent: []string{"noise", "=== RUN", "--- PASS", "PASS\n", "the race detector allocates"},
			failed: true,
		},
		{
			name:   "failures.txt (go test -v)",
			stream: "failures.txt",
			results: []string{
				"t2j/a TestPass pass", "t2j/a TestSkip skip: a_test.go:4: no reason here", "t2j/a TestSub/x skip: a_test.go:5: sub skip 1",
				"t2j/a TestSub/y fail", "t2j/a TestSub fail", "t2j/a  fail",
				// -v has no framing markers: the panic after TestOther's
				// PASS line keeps it open.
				"t2j/b TestOK pass", "t2j/b TestPanic fail", "t2j/b TestOther unfinished: panic: boom [recovered, repanicked]", "t2j/b  fail",
				"t2j/c TestHang unfinished: panic: test timed out after 3s", "t2j/c  fail",
				"t2j/d  fail",
			},
			echo: []string{"    a_test.go:5: bad y", "--- FAIL: TestSub/y", "FAIL\tt2j/a\t0.006s",
				"--- FAIL: TestPanic", "panic: boom [recovered, repanicked]", "t2j/b.TestPanic(", "FAIL\tt2j/b",
				"d/d_test.go:3:28: undefined: undefined", "FAIL\tt2j/d [build failed]",
				"panic: test timed out after 3s", "\t\tTestHang (3s)", "t2j/c.TestHang(", "FAIL\tt2j/c\t3.007s"},
			silent: []string{"hello", "no reason here", "sub skip 1", "=== RUN", "=== CONT"},
			failed: true,
		},
		{
			name: "go test -v cut short",
			stream: `=== RUN   TestA
--- PASS: TestA (0.00s)
PASS
ok  	m/p	0.010s
=== RUN   TestB
    q_test.go:3: last words
`,
			results: []string{"m/p TestA pass", "m/p  pass", "(unknown)  unfinished: the stream ended inside a package's output, before its result line"},
			echo:    []string{"ok  \tm/p\t0.010s", "    q_test.go:3: last words"},
			failed:  true,
		},
		{
			name: "passing package",
			stream: `{"Action":"start","Package":"m/p"}
{"Action":"run","Package":"m/p","Test":"TestA"}
{"Action":"output","Package":"m/p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"m/p","Test":"TestA","Output":"    p_test.go:9: a log line\n"}
{"Action":"output","Package":"m/p","Test":"TestA","Output":"--- PASS: TestA (0.00s)\n"}
{"Action":"pass","Package":"m/p","Test":"TestA","Elapsed":0}
{"Action":"output","Package":"m/p","Output":"PASS\n"}
{"Action":"output","Package":"m/p","Output":"ok  \tm/p\t0.010s\n"}
{"Action":"pass","Package":"m/p","Elapsed":0.01}`,
			results: []string{"m/p TestA pass", "m/p  pass"},
			echo:    []string{"ok  \tm/p\t0.010s"},
			silent:  []string{"a log line", "PASS\n"},
		},
		{
			name: "the go command's own words, and a stream cut short",
			stream: `go: downloading example.com/x v1.0.0
{"Action":"start","Package":"m/p"}
{"Action":"run","Package":"m/p","Test":"TestA"}
{"Action":"output","Package":"m/p","Test":"TestA","Output":"    p_test.go:9: last words\n"}`,
			results: []string{"m/p TestA unfinished: the test binary exited while the test ran (its output is above)", "m/p  unfinished"},
			echo:    []string{"go: downloading example.com/x v1.0.0", "last words", "the stream ended before the package did"},
			failed:  true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := tc.stream
			text := strings.HasSuffix(stream, ".txt") || strings.HasPrefix(tc.name, "go test -v")
			if strings.HasSuffix(stream, ".jsonl") || strings.HasSuffix(stream, ".txt") {
				b, err := os.ReadFile(filepath.Join("testdata", stream))
				if err != nil {
					t.Fatal(err)
				}
				stream = string(b)
			}
			var out bytes.Buffer
			rec := NewRecorder("full", ModeFull, &out)
			read := rec.Read
			if text {
				read = func(in io.Reader) error { return rec.ReadText(in, Test2JSON) }
			}
			if err := read(strings.NewReader(stream)); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rec.Results() {
				if r.Pass != "full" || r.Mode != ModeFull {
					t.Errorf("%+v: want pass full, mode full", r)
				}
				s := r.Package + " " + r.Test + " " + r.Action
				if r.Reason != "" {
					s += ": " + r.Reason
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tc.results) {
				t.Errorf("results:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.results, "\n"))
			}
			for _, s := range tc.echo {
				if !strings.Contains(out.String(), s) {
					t.Errorf("the echo lacks %q:\n%s", s, out.String())
				}
			}
			for _, s := range tc.silent {
				if strings.Contains(out.String(), s) {
					t.Errorf("the echo holds %q, which plain go test would not print:\n%s", s, out.String())
				}
			}
			if rec.Failed() != tc.failed {
				t.Errorf("Failed() = %v, want %v", rec.Failed(), tc.failed)
			}
		})
	}
}

// TestReport: under CI the only skips allowed are a reduced pass's, of a
// test the full pass ran and passed; every other skip, and any failure,
// fails the report, which names each.
func TestReport(t *testing.T) {
	raceSkip := Result{Pass: "race", Mode: ModeReduced, Package: "m/p", Test: "TestAllocs", Action: ActionSkip, Reason: "the race detector allocates"}
	fullPass := Result{Pass: "full", Mode: ModeFull, Package: "m/p", Test: "TestAllocs", Action: ActionPass}
	fullSkip := Result{Pass: "full", Mode: ModeFull, Package: "m/p", Test: "TestAllocs", Action: ActionSkip, Reason: "no dataset here"}
	envSkip := Result{Pass: "full", Mode: ModeFull, Package: "m/q", Test: "TestData", Action: ActionSkip, Reason: "SKIPPED: the data is not installed"}
	otherSkip := Result{Pass: "pure-go", Package: "m/p", Test: "TestAllocs", Action: ActionSkip, Reason: "gonum allocates"}
	pkgs := []Result{
		{Pass: "race", Mode: ModeReduced, Package: "m/p", Action: ActionPass},
		{Pass: "full", Mode: ModeFull, Package: "m/p", Action: ActionPass},
	}
	with := func(rs ...Result) []Result { return append(slices.Clone(pkgs), rs...) }
	for _, tc := range []struct {
		name    string
		results []Result
		ci      bool
		ok      bool
		want    []string
	}{
		{"race skip of a test the full pass passed", with(raceSkip, fullPass), true, true,
			[]string{`race  m/p TestAllocs: "the race detector allocates"`, "allowed: a -race/-short skip; the full pass ran it and it passed", "skipped (1)"}},
		{"race skip of a test the full pass skipped too", with(raceSkip, fullSkip), true, false,
			[]string{"the full pass did not run it and pass it", `FAIL: 2 skips under CI=true`, `full  m/p TestAllocs: "no dataset here"`}},
		{"race skip with no full pass", []Result{pkgs[0], raceSkip}, true, false,
			[]string{"unchecked: no full pass ran", "FAIL: no full pass ran, so 1 skips of the reduced passes are not explained"}},
		{"race skip, and a failure before the full pass: the failure is the news", []Result{pkgs[0], raceSkip,
			{Pass: "race", Mode: ModeReduced, Package: "m/q", Test: "TestX", Action: ActionFail}}, true, false,
			[]string{"unchecked: no full pass ran", "FAILED (1):", "race  m/q TestX: fail"}},
		{"an environment skip in the full pass, CI", with(envSkip), true, false,
			[]string{`full  m/q TestData: "SKIPPED: the data is not installed"`, "only a reduced (-race/-short) pass may skip", "FAIL: 1 skips"}},
		{"an environment skip in the full pass, not CI: counted, not failed", with(envSkip), false, true,
			[]string{"== test summary (CI=false)", `m/q TestData: "SKIPPED: the data is not installed"`, "skipped (1)", "1 skipped"}},
		{"a skip in another pass", with(fullPass, otherSkip), true, false,
			[]string{`pure-go  m/p TestAllocs: "gonum allocates"`, "FAIL: 1 skips"}},
		{"a failed test", with(fullPass, Result{Pass: "full", Mode: ModeFull, Package: "m/p", Test: "TestB", Action: ActionFail}), false, false,
			[]string{"FAILED (1):", "full  m/p TestB: fail"}},
		{"a test that did not finish", with(Result{Pass: "full", Mode: ModeFull, Package: "m/p", Test: "TestHang", Action: ActionUnfinished, Reason: "panic: test timed out after 20m0s"}), false, false,
			[]string{"m/p TestHang: did not finish: panic: test timed out after 20m0s"}},
		{"a step's exit status", with(Result{Pass: "fuzz", Action: ActionExit, Status: 1}), false, false,
			[]string{"fuzz  exited with status 1", "fuzz  -        exit status 1 (no go test results recorded)"}},
		{"a clean exit status", with(fullPass, Result{Pass: "full", Action: ActionExit}), true, true,
			[]string{"  full  full     1 passed, 0 skipped, 0 failed (tests and subtests) in 1 packages", "skipped (0)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if ok := Report(&out, tc.results, tc.ci, ""); ok != tc.ok {
				t.Errorf("Report = %v, want %v:\n%s", ok, tc.ok, out.String())
			}
			for _, s := range tc.want {
				if !strings.Contains(out.String(), s) {
					t.Errorf("the report lacks %q:\n%s", s, out.String())
				}
			}
			if tc.ok && strings.Contains(out.String(), "FAIL") {
				t.Errorf("a good report says FAIL:\n%s", out.String())
			}
		})
	}
}

// TestCommand: record, status and report through the state file, as
// scripts/test calls them, with their exit statuses.
func TestCommand(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	stream := `{"Action":"start","Package":"m/p"}
{"Action":"run","Package":"m/p","Test":"TestAllocs"}
{"Action":"output","Package":"m/p","Test":"TestAllocs","Output":"    p_test.go:4: the race detector allocates\n"}
{"Action":"skip","Package":"m/p","Test":"TestAllocs","Elapsed":0}
{"Action":"output","Package":"m/p","Output":"ok  \tm/p\t0.010s\n"}
{"Action":"pass","Package":"m/p","Elapsed":0.01}
`
	full := strings.ReplaceAll(strings.ReplaceAll(stream, `"skip","Package":"m/p","Test"`, `"pass","Package":"m/p","Test"`), "the race detector allocates", "fine")
	step := func(args []string, stdin string, want int) string {
		t.Helper()
		var out, errs bytes.Buffer
		if got := run(append(args, "-state", state), strings.NewReader(stdin), &out, &errs); got != want {
			t.Fatalf("testsummary %v: exit %d, want %d; stdout:\n%s\nstderr:\n%s", args, got, want, out.String(), errs.String())
		}
		return out.String()
	}
	if out := step([]string{"record", "-pass", "race", "-mode", "reduced"}, stream, 0); !strings.Contains(out, "== race: 0 passed, 1 skipped, 0 failed") {
		t.Errorf("record's count line:\n%s", out)
	}
	step([]string{"status", "-pass", "race", "-status", "0"}, "", 0)
	step([]string{"report", "-ci"}, "", 1) // no full pass yet: the skip is not explained
	step([]string{"record", "-pass", "full", "-mode", "full"}, full, 0)
	if out := step([]string{"report", "-ci"}, "", 0); !strings.Contains(out, "allowed: a -race/-short skip; the full pass ran it and it passed") {
		t.Errorf("report:\n%s", out)
	}
	step([]string{"status", "-pass", "full", "-status", "2"}, "", 0)
	if out := step([]string{"report"}, "", 1); !strings.Contains(out, "full  exited with status 2") {
		t.Errorf("report after a failed go test:\n%s", out)
	}
	bad := strings.Replace(stream, `"Action":"pass","Package":"m/p","Elapsed"`, `"Action":"fail","Package":"m/p","Elapsed"`, 1)
	step([]string{"record", "-pass", "again"}, bad, 1)
	step([]string{"record", "-pass", "x", "-mode", "partial"}, "", 2)
	step([]string{"frobnicate"}, "", 2)
}
