package testwait

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeT records a failure instead of ending the goroutine for good.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, a ...any) {
	f.failed = format
	panic(f)
}

// TestRecvAndWait: a value, a finished group or a condition that holds in
// time is returned; a late one fails the test naming what was awaited;
// Context ends at its limit.
func TestRecvAndWait(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if v := Recv(t, ch, time.Second, "seven"); v != 7 {
		t.Fatalf("Recv = %d", v)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	wg.Done()
	Wait(t, &wg, time.Second, "nothing")

	fails := func(f func(tb testing.TB)) (msg string) {
		ft := &fakeT{TB: t}
		defer func() {
			if r := recover(); r != ft {
				t.Fatalf("recovered %v", r)
			}
			msg = ft.failed
		}()
		f(ft)
		return ""
	}
	if msg := fails(func(tb testing.TB) { Recv(tb, make(chan int), 10*time.Millisecond, "a value") }); !strings.Contains(msg, "waited %v for %s") {
		t.Errorf("a receive that never comes: %q", msg)
	}
	var never sync.WaitGroup
	never.Add(1)
	if msg := fails(func(tb testing.TB) { Wait(tb, &never, 10*time.Millisecond, "a group") }); msg == "" {
		t.Error("a group that never finishes did not fail the test")
	}
	n := 0
	Until(t, time.Second, "the third poll", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("Until returned after %d polls, want 3", n)
	}
	if msg := fails(func(tb testing.TB) { Until(tb, 10*time.Millisecond, "never", func() bool { return false }) }); !strings.Contains(msg, "waited %v for %s") {
		t.Errorf("a condition that never holds: %q", msg)
	}
	ctx := Context(t, 10*time.Millisecond)
	<-ctx.Done() // bounded by the context's own limit
	if ctx.Err() == nil {
		t.Error("the context did not end at its limit")
	}
}
