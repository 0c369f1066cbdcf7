// Command testsummary reads `go test -json` and makes skips loud and
// counted: it echoes the run as plain `go test` would print it (package
// lines, and the output of failed, crashed or timed-out tests only), keeps
// every test's result and skip reason in a state file, and at the end of
// scripts/test prints which tests each pass skipped and why.
//
// Under CI=true the only skips allowed are those of a reduced pass (-race,
// -short) for tests the full pass ran and passed; any other skip fails the
// report. It is a tool of scripts/test, not part of the runtime.
//
//	go test -json ./... 2>&1 | testsummary record -state S -pass full -mode full
//	go test -race -v ./... 2>&1 | testsummary record -state S -pass race -mode reduced -text
//	testsummary status -state S -pass full -status $go_exit_status
//	testsummary report -state S [-ci] [-trim $(go list -m)/]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func usage(stderr io.Writer) int {
	fmt.Fprintln(stderr, `usage:
  testsummary record -state FILE -pass NAME [-mode full|reduced] [-text] < go test -json (-text: -v) output
  testsummary status -state FILE -pass NAME -status N
  testsummary report -state FILE [-ci] [-trim MODULE/]`)
	return 2
}

// run is main with its streams and exit status explicit, for the tests.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usage(stderr)
	}
	fs := flag.NewFlagSet("testsummary "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "", "the state file the passes' results are appended to")
	pass := fs.String("pass", "", "the pass's name (record, status)")
	mode := fs.String("mode", "", `"full": the pass that reduced passes' skips are checked against; "reduced": a -race or -short pass; "": any other`)
	status := fs.Int("status", 0, "the pass's exit status: go test's, or a step's such as scripts/fuzz (status)")
	trim := fs.String("trim", "", "a prefix (the module path and a slash) left out of package paths in the report")
	text := fs.Bool("text", false, "record: the stream is go test -v, not -json (each package converted with go tool test2json)")
	ci := fs.Bool("ci", os.Getenv("CI") == "true", "fail the report on any skip a reduced pass does not explain (default: CI=true)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if *state == "" || fs.NArg() != 0 {
		return usage(stderr)
	}
	switch args[0] {
	case "record":
		if *pass == "" || (*mode != "" && *mode != ModeFull && *mode != ModeReduced) {
			return usage(stderr)
		}
		rec := NewRecorder(*pass, *mode, stdout)
		read := rec.Read
		if *text {
			read = func(in io.Reader) error { return rec.ReadText(in, Test2JSON) }
		}
		if err := read(stdin); err != nil {
			fmt.Fprintf(stderr, "testsummary: %v\n", err)
			return 1
		}
		if err := AppendResults(*state, rec.Results()); err != nil {
			fmt.Fprintf(stderr, "testsummary: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, rec.Line())
		if rec.Failed() {
			return 1
		}
		return 0
	case "status":
		if *pass == "" {
			return usage(stderr)
		}
		if err := AppendResults(*state, []Result{{Pass: *pass, Action: ActionExit, Status: *status}}); err != nil {
			fmt.Fprintf(stderr, "testsummary: %v\n", err)
			return 1
		}
		return 0
	case "report":
		res, err := ReadResults(*state)
		if err != nil {
			fmt.Fprintf(stderr, "testsummary: %v\n", err)
			return 1
		}
		if !Report(stdout, res, *ci, *trim) {
			return 1
		}
		return 0
	}
	return usage(stderr)
}
