package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// storeWait bounds a test's own calls to a checkpoint store or an etcd
// (MinIO and etcd on a loaded machine included).
const storeWait = 2 * time.Minute

// stopGrace is how long runCommand waits, once its context has ended, for
// the command to return: a job cancelled with checkpoints stops after a
// final one.
const stopGrace = time.Minute

// testContext ends with the test, and after limit at the latest, so that
// a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB, limit time.Duration) context.Context {
	return testwait.Context(t, limit)
}

// runCommand runs the phalanx command with args in this process, as
// `phalanx args...` would, and returns its error. Its context ends after
// jobtest.Deadline() (PHALANX_TEST_WAIT, default 4m); if that comes first,
// the test fails naming the command: with its error and what it printed
// once it has returned, or stopGrace later if it has not.
func runCommand(t testing.TB, args []string, stdout, stderr io.Writer) error {
	t.Helper()
	limit := jobtest.Deadline()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, examples.Registry(), args, stdout, stderr) }()
	select {
	case err := <-done:
		if ctx.Err() != nil {
			t.Fatalf("waited %v for phalanx %s: %v\n%s", limit, strings.Join(args, " "), err, printed(stdout, stderr))
		}
		return err
	case <-time.After(limit + stopGrace):
		t.Fatalf("waited %v for phalanx %s, and %v more after its context ended", limit, strings.Join(args, " "), stopGrace)
		return nil
	}
}

// printed is the last lines written to each of ws that keeps them.
func printed(ws ...io.Writer) string {
	var b strings.Builder
	seen := map[io.Writer]bool{}
	for _, w := range ws {
		if s, ok := w.(fmt.Stringer); ok && !seen[w] {
			seen[w] = true
			b.WriteString(jobtest.LastLines(s.String(), 30))
		}
	}
	return b.String()
}
