// Command phalanx runs Phalanx jobs and their tools: it turns flags into
// the library's configuration and calls it. Each subcommand explains its
// flags with --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
)

const usage = `phalanx: a runtime for fault-tolerant, elastic distributed training.

Usage:
  phalanx train [flags]             train a model on N local elastic workers (or parameter servers)
  phalanx worker [flags]            one elastic worker of a job (joins through etcd)
  phalanx coordinator [flags]       a job's coordinator (elected; run several for standbys)
  phalanx ps [flags]                one parameter server of a job (train starts them for parameter-server models)
  phalanx stop [flags]              ask a running job to stop after a final checkpoint
  phalanx etcd [flags]              one embedded etcd member (three make a cluster)
  phalanx bench allreduce [flags]   allreduce figures over N local processes (nccl-tests style)
  phalanx bench tcp [flags]         raw single-stream loopback TCP throughput, the reference line
  phalanx bench checkpoint [flags]  checkpoint save, stall and resume figures against plain minio-go
  phalanx bench ps [flags]          sparse push+pull throughput against raw loopback TCP
  phalanx ckpt ls|inspect|verify|rm list, show, verify or delete the checkpoints at --checkpoint URL
  phalanx chaos run|list|soak       seeded fault schedules against real jobs, invariants checked, reports
  phalanx version (or --version)    print the version and the commit it was built from
  phalanx completion bash|zsh       shell completion of commands and flags: source <(phalanx completion bash)
  phalanx help COMMAND              the flags of a command (as phalanx COMMAND --help)

Run "phalanx <command> [<subcommand>] --help" for the flags of each.
`

// version is set at build time with -ldflags "-X main.version=..."; a
// module version (go install ...@v1.2.3) stands in for it.
var version = "dev"

// versionLine is "phalanx VERSION (commit REV[, modified]; GOVERSION
// OS/ARCH)": the commit as the Go toolchain stamped it from the checkout the
// binary was built in.
func versionLine() string {
	v, commit, modified := version, "unknown", ""
	goVersion := runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision":
				commit = s.Value
			case s.Key == "vcs.modified" && s.Value == "true":
				modified = ", modified"
			}
		}
	}
	return fmt.Sprintf("phalanx %s (commit %s%s; %s %s/%s)", v, commit, modified, goVersion, runtime.GOOS, runtime.GOARCH)
}

func main() {
	reg := examples.Registry()
	phalanx.Main(reg) // a worker process its launcher started: runs it and exits
	os.Exit(runMain(reg, os.Args[1:]))
}

// runMain runs a command line and returns the exit code. The first SIGINT
// or SIGTERM cancels its context (a job stops after a final checkpoint, a
// worker leaves its job); a second ends the process at once.
func runMain(reg *phalanx.Registry, args []string) int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		cancel(fmt.Errorf("signal %v", s))
		<-sigs
		os.Exit(1)
	}()
	err := run(ctx, reg, args, os.Stdout, os.Stderr)
	signal.Stop(sigs)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, errorLine(err))
	}
	return exitCode(err)
}

// errorLine is err for the terminal, under one "phalanx: " prefix: the
// library's errors carry it already.
func errorLine(err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, "phalanx: ") {
		return msg
	}
	return "phalanx: " + msg
}

// Exit statuses besides 0, 1 (failed) and 2 (usage).
const (
	exitStoppedOnRequest = 3 // the job stopped after a final checkpoint; the same command resumes it
	exitJobStopped       = 4 // a worker whose job was stopped (too few workers, or on request): not its own failure
)

func exitCode(err error) int {
	var ue usageError
	var se *phalanx.StoppedError
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp) || errors.Is(err, phalanx.ErrLeft):
		return 0
	case errors.As(err, &ue):
		return 2
	case errors.As(err, &se) && se.Requested:
		return exitStoppedOnRequest
	case errors.As(err, &se):
		return exitJobStopped
	}
	return 1
}

// usageError is a mistake in the command line.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func run(ctx context.Context, reg *phalanx.Registry, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("no command given")
	}
	switch args[0] {
	case "train":
		return runTrain(ctx, reg, args[1:], stdout, stderr)
	case "chaos":
		return runChaos(ctx, reg, args[1:], stdout, stderr)
	case "worker":
		return runWorker(ctx, reg, args[1:], stdout, stderr)
	case "coordinator":
		return runCoordinator(ctx, args[1:], stdout, stderr)
	case "ps":
		return runPS(ctx, args[1:], stdout, stderr)
	case "stop":
		return runStop(ctx, args[1:], stdout, stderr)
	case "etcd":
		return runEtcd(ctx, args[1:], stdout, stderr)
	case "bench":
		return runBench(ctx, args[1:], stdout, stderr)
	case "ckpt":
		return runCkpt(ctx, args[1:], stdout, stderr)
	case "completion":
		return runCompletion(args[1:], stdout)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, versionLine())
		return nil
	case "help", "-h", "--help", "-help":
		if len(args) > 1 && args[0] == "help" { // phalanx help train: its flags
			return run(ctx, reg, append(args[1:len(args):len(args)], "--help"), stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usagef("unknown command %q", args[0])
}

// newLogger writes JSON logs to w at the given level.
func newLogger(level string, w io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), lvl)), nil
}

// parseWithLogger defines --log-level on fs, parses args, and returns a
// logger writing JSON to stderr at that level.
func parseWithLogger(fs *flag.FlagSet, args []string, stderr io.Writer) (*zap.Logger, error) {
	level := fs.String("log-level", "warn", "log level (logs go to stderr): debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	return newLogger(*level, stderr)
}

// newFlagSet returns the flag set of "phalanx name": --help prints the
// summary, the flags and how the environment sets them on help (stdout);
// a mistake is a usage error of one line (parseArgs), never the help.
func newFlagSet(name, summary string, help io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(help, "Usage: phalanx %s [flags]\n\n%s\n", name, summary)
		if groupedHelp[name] {
			printGrouped(help, fs)
		} else {
			fmt.Fprintln(help, "\nFlags:")
			fs.VisitAll(func(f *flag.Flag) { printFlag(help, f) })
		}
		fmt.Fprintln(help, "\n"+envNote)
		if ex := helpExamples[name]; ex != "" {
			fmt.Fprintf(help, "\nExamples:\n%s", ex)
		}
	}
	return fs
}

// parseFlags parses a command line of flags only (see parseArgs).
func parseFlags(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err == nil && len(pos) > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), pos[0])
	}
	return err
}

// parseArgs parses fs's flags wherever they stand among the positional
// arguments (phalanx chaos run kill-random --runs 50), which it returns in
// order; "--" ends the flags. Every flag not on the command line is then
// taken from its environment variable (PHALANX_ and the flag's name in
// capitals, dashes as underscores), if set. --help prints the help and
// returns flag.ErrHelp; any mistake is a one-line usage error naming the
// flag (an unknown one with the nearest known ones).
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	help := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = help }()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				help()
				return nil, err
			}
			return nil, flagMistake(fs, err)
		}
		if fs.NArg() == 0 {
			break
		}
		args = fs.Args()
		if args[0] == "--" {
			pos = append(pos, args[1:]...)
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := envOf(f.Name)
		v, ok := os.LookupEnv(env)
		if given[f.Name] || !ok || err != nil {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = usagef("%s=%q (--%s): %v", env, v, f.Name, serr)
		}
	})
	return pos, err
}

// envOf is the environment variable of flag name: PHALANX_LOG_LEVEL for
// log-level.
func envOf(name string) string {
	return "PHALANX_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flagMistake rewrites the flag package's error as one line with the
// flag's name as it is typed (--name), suggesting the known flags nearest
// to an unknown one.
func flagMistake(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimLeft(name, "-")
		line := fmt.Sprintf("%s: unknown flag --%s", fs.Name(), name)
		if near := nearestFlags(fs, name); len(near) > 0 {
			line += "; did you mean --" + strings.Join(near, " or --") + "?"
		}
		return usageError{line}
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return usagef("%s: --%s needs a value", fs.Name(), strings.TrimLeft(name, "-"))
	}
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		// invalid value "x" for flag -name: reason
		if v, tail, ok := strings.Cut(rest, " for flag -"); ok {
			if name, why, ok := strings.Cut(tail, ": "); ok {
				return usagef("--%s %s: %s", strings.TrimLeft(name, "-"), v, why)
			}
		}
	}
	if rest, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		if v, tail, ok := strings.Cut(rest, " for -"); ok {
			if name, why, ok := strings.Cut(tail, ": "); ok {
				return usagef("--%s %s: %s", strings.TrimLeft(name, "-"), v, why)
			}
		}
	}
	return usagef("%s: %s", fs.Name(), msg)
}

// nearestFlags are the flags of fs within a few edits of name (or that it
// begins), nearest first, at most three.
func nearestFlags(fs *flag.FlagSet, name string) []string {
	type cand struct {
		name string
		d    int
	}
	var cs []cand
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		if d <= max(2, len(name)/3) {
			cs = append(cs, cand{f.Name, d})
		}
	})
	slices.SortStableFunc(cs, func(a, b cand) int { return a.d - b.d })
	var out []string
	for i := 0; i < len(cs) && i < 3; i++ {
		out = append(out, cs[i].name)
	}
	return out
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
