// Package testwait bounds a test's waits: a context that ends with the
// test and after a limit at the latest, and a receive or a WaitGroup wait
// that fails the test, naming what it waited for, once its limit passes.
// It is for tests only: a wait without a deadline hangs a package until go
// test's own timeout, and says nothing of what never came.
package testwait

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Context ends when the test does, and after limit at the latest.
func Context(t testing.TB, limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}

// Recv receives from ch, failing the test, naming what it waited for, after
// limit. Call it from the test's goroutine.
func Recv[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v for %s", limit, what)
		panic("unreachable")
	}
}

// Wait waits for wg, failing the test, naming what it waited for, after
// limit. Call it from the test's goroutine.
func Wait(t testing.TB, wg *sync.WaitGroup, limit time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	Recv(t, done, limit, what)
}

// Until polls cond until it holds, failing the test, naming what it waited
// for, after limit. It is for state only the kernel or another process
// holds (a /proc file, a process's output), where there is no event to wait
// on. Call it from the test's goroutine.
func Until(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(time.Millisecond)
	}
}
