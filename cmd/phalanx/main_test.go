package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
)

// TestUsageErrors: a bad command line is a usage error (exit 2) that names
// the flag and the problem, before anything starts.
func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"train", "--workers", "0"}, "--workers 0"},
		{[]string{"train", "--example", "bert"}, "--example bert"},
		{[]string{"train", "--steps", "0"}, "--steps 0"},
		{[]string{"train", "--lr", "-1"}, "learning rate"},
		{[]string{"train", "--optimizer", "lion"}, "unknown optimizer"},
		{[]string{"train", "--schedule", "exp"}, "unknown schedule"},
		{[]string{"train", "--hidden", "512,x"}, "option hidden"},
		{[]string{"train", "--hidden", "3", "--example", "sparse-lr"}, "no such option"},
		{[]string{"train", "--data", "/nonexistent/mnist"}, "train-images-idx3-ubyte"},
		{[]string{"train", "--bucket", "lots"}, "--bucket"},
		{[]string{"train", "--sync", "asp"}, "--sync asp"},
		{[]string{"train", "--quorum", "2", "--sync", "hybrid"}, "--sync"},
		{[]string{"train", "--checkpoint-every-steps", "5"}, `--checkpoint "": --checkpoint-every-steps, --checkpoint-every and --resume need a location`},
		{[]string{"train", "--workers", "3", "--min-workers", "5"}, "--min-workers 5: want 1 <= --min-workers <= --max-workers (3)"},
		{[]string{"train", "--batch", "8", "--reference-world", "9", "--rescale", "lr"}, "--reference-world 9: want 1..--batch"},
		{[]string{"train", "--fail-at", "9:3", "--workers", "2"}, "--fail-at 9"},
		{[]string{"train", "--example", "sparse-lr", "--ps-replicas", "2"}, "--ps-replicas 2"},
		{[]string{"worker", "--job", "j"}, "--etcd-endpoints"},
		{[]string{"stop"}, "--etcd-endpoints and --job"},
		{[]string{"status", "--job", "j"}, "--etcd-endpoints and --job"},
		{[]string{"debug", "hang"}, "--events is required"},
		{[]string{"debug"}, "name the debug tool: hang"},
		{[]string{"train", "--inject-wrong-op", "rank=1"}, `--inject-wrong-op "rank=1": at: want a step from 1`},
		{[]string{"train", "--metrics", "127.0.0.1:99999"}, `--metrics 127.0.0.1:99999: port "99999"`},
		{[]string{"train", "--status", "nohost"}, "--status nohost: want host:port"},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		err := runCommand(t, tc.args, &out, &errOut)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want a usage error mentioning %q", tc.args, err, tc.want)
		}
	}
}

// TestHelpAndVersion: every command group answers --help on stdout with
// its subcommands, help COMMAND gives a command's flags, and --version
// says the version and the commit.
func TestHelpAndVersion(t *testing.T) {
	cases := []struct {
		args []string
		want string // on stdout ("" : on stderr, flag's help)
	}{
		{[]string{"--help"}, "phalanx chaos run [flags] SCENARIO..."},
		{[]string{"help"}, "phalanx bench allreduce [flags]"},
		{[]string{"-h"}, "phalanx completion bash|zsh|fish|powershell"},
		{[]string{"chaos", "--help"}, "phalanx chaos run [flags] SCENARIO..."},
		{[]string{"chaos", "help"}, "phalanx chaos soak [flags]"},
		{[]string{"ckpt", "--help"}, "phalanx ckpt verify --checkpoint URL"},
		{[]string{"ckpt", "-h"}, "phalanx ckpt rm --checkpoint URL"},
		{[]string{"bench", "--help"}, "phalanx bench allreduce [flags]"},
		{[]string{"--version"}, "phalanx dev (commit "},
		{[]string{"version"}, "phalanx dev (commit "},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		if err := runCommand(t, tc.args, &out, &errOut); err != nil {
			t.Errorf("%v: %v\n%s", tc.args, err, errOut.String())
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v printed %q on stdout, want %q", tc.args, out.String(), tc.want)
		}
	}
	for _, args := range [][]string{{"help", "train"}, {"train", "--help"}, {"ckpt", "ls", "--help"}, {"chaos", "run", "--help"}} {
		var out, errOut bytes.Buffer
		err := runCommand(t, args, &out, &errOut)
		if err != nil || !strings.Contains(out.String(), "Usage: phalanx ") || !strings.Contains(out.String(), "from the environment") || errOut.Len() != 0 {
			t.Errorf("%v: %v; want the help (with the environment's part) on stdout alone:\nstdout: %s\nstderr: %s", args, err, out.String(), errOut.String())
		}
	}
}

// TestMistakeIsOneLine: a mistyped flag is one usage error (exit 2) naming
// it as typed, with the nearest known flag, and nothing else is printed: no
// help, no second copy. Every command's mistakes are usage errors.
func TestMistakeIsOneLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--workrs", "2"}, "train: unknown flag --workrs; did you mean --workers?"},
		{[]string{"train", "--steps", "many"}, `--steps "many": want a whole number`},
		{[]string{"train", "-workers", "2"}, "train: -workers: long flags take two dashes: --workers"},
		{[]string{"chaos", "runn"}, `chaos: unknown subcommand "runn" (want list, run or soak); did you mean run?`},
		{[]string{"trian"}, `unknown command "trian" (want bench, certs, chaos, ckpt, completion, coordinator, debug, etcd, ps, sample, status, stop, train, version or worker); did you mean train?`},
		{[]string{"help", "trian"}, `help: unknown command "trian"; did you mean train?`},
		{[]string{"version", "x"}, `version: unexpected argument "x"`},
		{[]string{"chaos", "run", "--bogus", "kill-one"}, "chaos run: unknown flag --bogus"},
		{[]string{"chaos", "soak", "--duraton", "1m"}, "chaos soak: unknown flag --duraton; did you mean --duration?"},
		{[]string{"ckpt", "ls", "--checkpiont", "x"}, "ckpt ls: unknown flag --checkpiont; did you mean --checkpoint?"},
		{[]string{"bench", "tcp", "--bytes"}, "bench tcp: unknown flag --bytes"},
		{[]string{"chaos", "run", "/nonexistent/s.yaml"}, "chaos run: chaos: reading scenario: open /nonexistent/s.yaml: no such file or directory"},
	} {
		var out, errOut bytes.Buffer
		err := runCommand(t, c.args, &out, &errOut)
		var ue usageError
		if !errors.As(err, &ue) || err.Error() != c.want || exitCode(err) != 2 || out.Len()+errOut.Len() != 0 {
			t.Errorf("%v: %v (exit %d), printed %q %q; want only the usage error %q", c.args, err, exitCode(err), out.String(), errOut.String(), c.want)
		}
	}
}

// TestErrorLine: an error reaches the terminal under one "phalanx: " prefix,
// whether or not the library's message carries it.
func TestErrorLine(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&phalanx.StoppedError{Step: 311, Requested: true, Checkpoint: "step-000000000311-g1-ab"},
			"phalanx: stopped at step 311 after a final checkpoint (step-000000000311-g1-ab); launch the same job again to resume"},
		{&phalanx.StoppedError{Step: 311, Requested: true}, "phalanx: stopped on request at step 311, after a final checkpoint"},
		{usagef("--workers 0: want 1..64"), "phalanx: --workers 0: want 1..64"},
		{fmt.Errorf("train: %w", errors.New("phalanx: deep")), "phalanx: train: phalanx: deep"},
	} {
		if got := errorLine(c.err); got != c.want {
			t.Errorf("errorLine(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestHelpGrouped: train's and worker's help list their flags by topic, each
// flag once, with its default said once, and end with examples. Every flag
// has a topic but the models' options, which the model's topic lists: a new
// flag must be placed.
func TestHelpGrouped(t *testing.T) {
	options := map[string]bool{}
	for _, s := range examples.Registry().Specs() {
		for _, o := range s.Options {
			options[o.Name] = true
		}
	}
	placed := map[string]bool{}
	for _, tp := range flagTopics {
		for _, n := range tp.flags {
			placed[n] = true
		}
	}
	for _, cmd := range []string{"train", "worker"} {
		var out bytes.Buffer
		if err := runCommand(t, []string{cmd, "--help"}, &out, io.Discard); err != nil {
			t.Fatalf("%s --help: %v", cmd, err)
		}
		help := out.String()
		at := -1
		for _, want := range []string{"\nJob:\n", "\nModel (--example and its options):\n", "\nOptimizer and schedule:\n", "\nSynchronisation:\n",
			"\nCheckpoints:\n", "\nElastic membership and recovery:\n", "\nData plane:\n", "\nFault injection:\n", "\nLogs:\n", "\nExamples:\n"} {
			i := strings.Index(help, want)
			if i < at {
				t.Errorf("%s --help: %q missing or out of order", cmd, want)
			}
			at = max(at, i)
		}
		flags := regexp.MustCompile(`(?m)^  --([a-z0-9-]+)`).FindAllStringSubmatch(help, -1)
		seen := map[string]bool{}
		for _, m := range flags {
			if seen[m[1]] {
				t.Errorf("%s --help lists --%s twice", cmd, m[1])
			}
			seen[m[1]] = true
			if !placed[m[1]] && !options[m[1]] {
				t.Errorf("%s: --%s has no topic in flagTopics", cmd, m[1])
			}
		}
		if len(flags) < 60 || regexp.MustCompile(`\(default[^)]*\) \(default`).MatchString(help) {
			t.Errorf("%s --help: %d flags, or a default said twice:\n%s", cmd, len(flags), help)
		}
	}
}

// bashCompletionStub stands in for bash-completion's word splitting when
// that Debian package is absent (cobra's script calls it); the rest of the
// script runs as the shell would run it.
const bashCompletionStub = `
if [ -r /usr/share/bash-completion/bash_completion ]; then
  . /usr/share/bash-completion/bash_completion
else
  _get_comp_words_by_ref() { cur=${COMP_WORDS[COMP_CWORD]}; prev=${COMP_WORDS[COMP_CWORD-1]}; words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }
fi
`

// TestCompletion: cobra's bash script, run in a real bash against this
// binary as phalanx, completes commands, subcommands, each command's flags,
// the values of flags that take one of a set, and chaos scenarios; zsh,
// fish and powershell get theirs, and an unknown shell is a usage error.
func TestCompletion(t *testing.T) {
	var script bytes.Buffer
	if err := runCommand(t, []string{"completion", "bash"}, &script, io.Discard); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		line string // the command line, completed at its end
		want string
	}{
		{"ch", "chaos"},
		{"c", "certs chaos ckpt completion coordinator"},
		{"chaos r", "run"},
		{"train --work", "--workers"},
		{"train --checkpoint-e", "--checkpoint-every --checkpoint-every-steps"},
		{"ckpt ls --ver", "--verify"},
		{"worker --js", "--json"},
		{"train --sync ", "bsp hybrid asp ssp"},
		{"train --example sp", "sparse-lr"},
		{"worker --log-level ", "debug info warn error"},
		{"chaos run kill-r", "kill-random"},
		{"help tr", "train"},
		{"bench allreduce --tl", "--tls"}, // not the ranks' hidden --tls-ca, --tls-cert, --tls-key
		{"bench allreduce --tls ", "off on compare"},
	} {
		words := strings.Fields(c.line)
		cword := len(words)
		if strings.HasSuffix(c.line, " ") {
			words = append(words, "''")
		} else {
			cword--
		}
		cmd := exec.CommandContext(testContext(t, time.Minute), "bash", "-c", bashCompletionStub+script.String()+fmt.Sprintf(
			"\nCOMP_WORDS=(%s %s); COMP_CWORD=%d; COMP_LINE='phalanx %s'; COMP_POINT=${#COMP_LINE}; COMP_TYPE=9; __start_phalanx; echo \"${COMPREPLY[@]}\"",
			exe, strings.Join(words, " "), cword+1, c.line))
		cmd.Env = append(os.Environ(), "PHALANX_TEST_AS_COMMAND=1")
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != c.want {
			t.Errorf("completing %q: %q, %v; want %q", c.line, out, err, c.want)
		}
	}
	for shell, want := range map[string]string{"zsh": "#compdef phalanx", "fish": "complete -c phalanx", "powershell": "Register-ArgumentCompleter"} {
		var out bytes.Buffer
		if err := runCommand(t, []string{"completion", shell}, &out, io.Discard); err != nil || !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "__complete") {
			t.Errorf("completion %s: %v; want a script with %q that asks phalanx __complete:\n%.300s", shell, err, want, out.String())
		}
	}
	for _, args := range [][]string{{"completion", "tcsh"}, {"completion"}} {
		if err := runCommand(t, args, io.Discard, io.Discard); exitCode(err) != 2 {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}
