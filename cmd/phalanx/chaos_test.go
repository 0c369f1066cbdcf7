package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		names []string
		runs  int
	}{
		{[]string{"kill-random", "--runs", "50"}, []string{"kill-random"}, 50},
		{[]string{"--runs", "3", "a", "b"}, []string{"a", "b"}, 3},
		{[]string{"a", "--runs=2", "b.yaml"}, []string{"a", "b.yaml"}, 2},
		{[]string{"a", "--", "--runs"}, []string{"a", "--runs"}, 1},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		runs := fs.Int("runs", 1, "")
		names, err := parseInterspersed(fs, tc.args)
		if err != nil || !slices.Equal(names, tc.names) || *runs != tc.runs {
			t.Errorf("%q: names %q, runs %d, %v; want %q, %d", tc.args, names, *runs, err, tc.names, tc.runs)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := parseInterspersed(fs, []string{"a", "--nope"}); err == nil {
		t.Error("an unknown flag after a name was accepted")
	}
}
