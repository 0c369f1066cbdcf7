package jobtest

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
)

// fatalTB records a Fatalf and ends the goroutine, as testing's does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls fn with a recording TB on its own goroutine and returns the
// fatal message ("" if none).
func run(t *testing.T, fn func(tb testing.TB)) string {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	return f.msg
}

// TestKillRefusesNoProcess: a pid that names no process of its own (0,
// negative, init) and a worker never seen started fail the test instead
// of signalling a process group; signal 0 to this very process goes
// through.
func TestKillRefusesNoProcess(t *testing.T) {
	for _, c := range []struct {
		name string
		fn   func(tb testing.TB)
		fail bool
	}{
		{"pid 0", func(tb testing.TB) { Kill(tb, 0, syscall.Signal(0)) }, true},
		{"pid -1", func(tb testing.TB) { Kill(tb, -1, syscall.Signal(0)) }, true},
		{"pid 1", func(tb testing.TB) { Kill(tb, 1, syscall.Signal(0)) }, true},
		{"no such worker", func(tb testing.TB) { (&Job{}).KillWorker(tb, 3, syscall.Signal(0)) }, true},
		{"this process", func(tb testing.TB) { Kill(tb, syscall.Getpid(), syscall.Signal(0)) }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := run(t, c.fn)
			if (msg != "") != c.fail {
				t.Fatalf("fatal %q, want failing %v", msg, c.fail)
			}
		})
	}
}
