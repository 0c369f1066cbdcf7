package worker

import (
	"context"
	"testing"
	"time"
)

// testContext ends with the test, and after two minutes at the latest, so
// that a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// recvWithin receives from ch, failing the test, naming what it waited
// for, after limit.
func recvWithin[T any](t testing.TB, ch <-chan T, limit time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(limit):
		t.Fatalf("waited %v for %s", limit, what)
		panic("unreachable")
	}
}
