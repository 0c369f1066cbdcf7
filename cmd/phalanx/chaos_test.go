package main

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestParseArgs: through the command tree's shared behaviour
// (configureRoot), flags stand anywhere among the positional arguments ("--"
// ends them); a flag not given comes from its PHALANX_ variable, the
// command line winning; every mistake is one usage line naming the flag as
// typed, an unknown one with the nearest known ones.
func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		env   map[string]string
		names []string
		runs  int
		level string
		err   string
	}{
		{args: []string{"kill-random", "--runs", "50"}, names: []string{"kill-random"}, runs: 50, level: "warn"},
		{args: []string{"--runs", "3", "a", "b"}, names: []string{"a", "b"}, runs: 3, level: "warn"},
		{args: []string{"a", "--runs=2", "b.yaml"}, names: []string{"a", "b.yaml"}, runs: 2, level: "warn"},
		{args: []string{"a", "--", "--runs"}, names: []string{"a", "--runs"}, runs: 1, level: "warn"},
		{args: []string{"a"}, env: map[string]string{"PHALANX_RUNS": "7", "PHALANX_LOG_LEVEL": "debug"}, names: []string{"a"}, runs: 7, level: "debug"},
		{args: []string{"--runs", "2"}, env: map[string]string{"PHALANX_RUNS": "7"}, runs: 2, level: "warn"},
		{args: []string{"a"}, env: map[string]string{"PHALANX_RUNS": "many"}, err: `PHALANX_RUNS="many" (--runs): want a whole number`},
		{args: []string{"a", "--nope"}, err: "t: unknown flag --nope"},
		{args: []string{"--rnus", "2"}, err: "t: unknown flag --rnus; did you mean --runs?"},
		{args: []string{"--log-levl", "info"}, err: "t: unknown flag --log-levl; did you mean --log-level?"},
		{args: []string{"--runs"}, err: "t: --runs needs a value"},
		{args: []string{"--runs", "x"}, err: `--runs "x": want a whole number`},
		{args: []string{"-runs", "2"}, err: "t: -runs: long flags take two dashes: --runs"},
		{args: []string{"-zz"}, err: "t: unknown flag -zz"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			root := &cobra.Command{Use: "phalanx"}
			configureRoot(root, io.Discard, io.Discard)
			var names []string
			cmd := withRun(leaf("t [flags] NAME...", "", ""), func(_ context.Context, args []string) error {
				names = args
				return nil
			})
			cmd.Args = cobra.ArbitraryArgs
			root.AddCommand(cmd)
			runs := cmd.Flags().Int("runs", 1, "")
			level := cmd.Flags().String("log-level", "warn", "")
			root.SetArgs(append([]string{"t"}, tc.args...))
			err := root.Execute()
			var ue usageError
			switch {
			case tc.err != "" && (!errors.As(err, &ue) || err.Error() != tc.err):
				t.Errorf("%q: %v, want the usage error %q", tc.args, err, tc.err)
			case tc.err == "" && (err != nil || !slices.Equal(names, tc.names) || *runs != tc.runs || *level != tc.level):
				t.Errorf("%q (env %v): names %q, runs %d, level %s, %v; want %q, %d, %s", tc.args, tc.env, names, *runs, *level, err, tc.names, tc.runs, tc.level)
			}
		})
	}
}
