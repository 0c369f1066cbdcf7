package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// AppendResults adds results to the state file, one JSON object a line.
func AppendResults(path string, results []Result) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, res := range results {
		if err := enc.Encode(res); err != nil {
			f.Close()
			return fmt.Errorf("state file %s: %w", path, err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("state file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	return nil
}

// ReadResults reads every pass's results; a missing file holds none.
func ReadResults(path string) ([]Result, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	defer f.Close()
	var out []Result
	dec := json.NewDecoder(f)
	for {
		var res Result
		if err := dec.Decode(&res); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("state file %s: %w", path, err)
		}
		out = append(out, res)
	}
}

// counts are one pass's tallies.
type counts struct {
	packages, passed, skipped, failed int
	exit                              *int
}

func (c *counts) add(res Result) {
	switch {
	case res.Action == ActionExit:
		c.exit = &res.Status
	case res.Test == "" && res.Action == ActionBuildFail:
		c.failed++
	case res.Test == "":
		c.packages++
	case res.Action == ActionPass:
		c.passed++
	case res.Action == ActionSkip:
		c.skipped++
	default:
		c.failed++
	}
}

func (c counts) String() string {
	if c.packages == 0 && c.passed+c.skipped+c.failed == 0 && c.exit != nil {
		return fmt.Sprintf("exit status %d (no go test results recorded)", *c.exit)
	}
	return fmt.Sprintf("%d passed, %d skipped, %d failed (tests and subtests) in %d packages", c.passed, c.skipped, c.failed, c.packages)
}

// key names a test in every pass.
type key struct{ pkg, test string }

// Report prints each pass's counts, every skip with its reason and whether
// CI allows it, and every failure; it says whether the run is good: no
// failure and, when ci, no skip other than a reduced pass's of a test the
// full pass ran and passed.
// Package paths are printed without trim (the module path and a slash:
// the module's root package prints as ".").
func Report(w io.Writer, results []Result, ci bool, trim string) bool {
	var passes []string
	per := map[string]*counts{}
	modes := map[string]string{}
	fullPassed := map[key]string{} // the full pass that passed it
	fullRan := false
	for _, res := range results {
		c := per[res.Pass]
		if c == nil {
			c = &counts{}
			per[res.Pass] = c
			passes = append(passes, res.Pass)
		}
		c.add(res)
		if res.Mode != "" {
			modes[res.Pass] = res.Mode
		}
		if res.Mode == ModeFull {
			fullRan = true
			if res.Action == ActionPass && res.Test != "" {
				fullPassed[key{res.Package, res.Test}] = res.Pass
			}
		}
	}
	name := func(res Result) string {
		p := res.Package
		if trim != "" && p+"/" == trim {
			p = "."
		} else {
			p = strings.TrimPrefix(p, trim)
		}
		if res.Test == "" {
			return p
		}
		return p + " " + res.Test
	}

	fmt.Fprintf(w, "== test summary (CI=%v)\n", ci)
	width := 4
	for _, p := range passes {
		width = max(width, len(p))
	}
	for _, p := range passes {
		mode := modes[p]
		if mode == "" {
			mode = "-"
		}
		fmt.Fprintf(w, "  %-*s  %-7s  %s\n", width, p, mode, per[p])
	}

	ok := true
	var skips, bad []string
	unchecked := 0 // reduced passes' skips when no full pass ran to explain them
	for _, res := range results {
		if res.Test == "" || res.Action != ActionSkip {
			continue
		}
		verdict := ""
		full, passed := fullPassed[key{res.Package, res.Test}]
		switch {
		case res.Mode == ModeReduced && passed:
			verdict = fmt.Sprintf("allowed: a -race/-short skip; the %s pass ran it and it passed", full)
		case res.Mode == ModeReduced && !fullRan:
			verdict = "unchecked: no full pass ran"
			unchecked++
		case res.Mode == ModeReduced:
			verdict = "NOT ALLOWED under CI: the full pass did not run it and pass it"
		default:
			verdict = "NOT ALLOWED under CI: only a reduced (-race/-short) pass may skip"
		}
		line := fmt.Sprintf("  %-*s  %s: %q\n  %*s    -> %s", width, res.Pass, name(res), res.Reason, width, "", verdict)
		skips = append(skips, line)
		if !(res.Mode == ModeReduced && (passed || !fullRan)) {
			bad = append(bad, fmt.Sprintf("  %-*s  %s: %q", width, res.Pass, name(res), res.Reason))
		}
	}
	fmt.Fprintf(w, "skipped (%d):\n", len(skips))
	for _, s := range skips {
		fmt.Fprintln(w, s)
	}

	var failures []string
	for _, res := range results {
		if !isFailure(res) {
			continue
		}
		var what string
		switch res.Action {
		case ActionExit:
			what = fmt.Sprintf("exited with status %d", res.Status)
		case ActionBuildFail:
			what = res.Package + ": the test binary did not build"
		case ActionUnfinished:
			what = name(res) + ": did not finish: " + res.Reason
		default:
			what = name(res) + ": " + res.Action
		}
		failures = append(failures, fmt.Sprintf("  %-*s  %s", width, res.Pass, what))
	}
	if len(failures) > 0 {
		ok = false
		fmt.Fprintf(w, "FAILED (%d):\n", len(failures))
		for _, f := range failures {
			fmt.Fprintln(w, f)
		}
	}
	if ci && unchecked > 0 && len(failures) == 0 {
		ok = false
		fmt.Fprintf(w, "FAIL: no full pass ran, so %d skips of the reduced passes are not explained\n", unchecked)
	}
	if ci && len(bad) > 0 {
		ok = false
		fmt.Fprintf(w, "FAIL: %d skips under CI=true; the only skips allowed are a -race/-short pass's, of tests the full pass ran and passed:\n", len(bad))
		for _, b := range bad {
			fmt.Fprintln(w, b)
		}
	}
	return ok
}
