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

// newFlagSet returns a flag set whose --help prints the summary and the flags.
func newFlagSet(name, summary string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: phalanx %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return fs
}

func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}
