// Command phalanx runs Phalanx jobs and their tools: it turns flags into
// the library's configuration and calls it. Each subcommand explains its
// flags with --help. The command tree is spf13/cobra's, with pflag's
// flags, as etcdctl's and kubectl's are.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
)

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
	if err != nil {
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
	case err == nil || errors.Is(err, phalanx.ErrLeft):
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

// run runs one command line through the command tree (commands.go).
func run(ctx context.Context, reg *phalanx.Registry, args []string, stdout, stderr io.Writer) error {
	root := newRoot(reg, stdout, stderr)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
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

// withLoggedRun is withRun for a command that logs: it defines --log-level
// and hands run its logger (JSON on stderr).
func withLoggedRun(c *cobra.Command, stderr io.Writer, run func(ctx context.Context, args []string, log *zap.Logger) error) *cobra.Command {
	level := c.Flags().String("log-level", "warn", "log level (logs go to stderr): debug, info, warn or error")
	completeLogLevel(c)
	return withRun(c, func(ctx context.Context, args []string) error {
		log, err := newLogger(*level, stderr)
		if err != nil {
			return err
		}
		defer log.Sync()
		return run(ctx, args, log)
	})
}
