package coordinator

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDial: Dial returns a client once etcd answers; at an endpoint where
// nothing listens it says every Every what it waits for, then gives up
// past Wait naming the endpoint; a context that ends stops the wait at
// once, with its cause.
func TestDial(t *testing.T) {
	const nothing = "http://127.0.0.1:1" // port 1: nothing listens, connections are refused
	tests := []struct {
		name      string
		endpoints []string
		wait      time.Duration
		cancelAt  int    // cancel the context at this Say line (0: never)
		want      string // "" : a client; else in the error
		minLines  int
	}{
		{"an embedded etcd", endpoints, time.Minute, 0, "", 0},
		{"nothing listening", []string{nothing}, 3 * time.Second, 0, "etcd at 127.0.0.1:1 did not answer within 3s", 1},
		{"cancelled while waiting", []string{nothing}, time.Hour, 2, "waiting for etcd at 127.0.0.1:1: an operator's signal", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			bound, stop := context.WithTimeout(ctx, time.Minute) // the test's own bound
			defer stop()
			var mu sync.Mutex
			var lines []string
			cli, err := Dial(bound, tc.endpoints, DialOptions{Wait: tc.wait, Every: 100 * time.Millisecond, Say: func(l string) {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, l)
				if len(lines) == tc.cancelAt {
					cancel(errors.New("an operator's signal"))
				}
			}})
			if bound.Err() != nil && ctx.Err() == nil {
				t.Fatalf("Dial still waited after a minute: %v", err)
			}
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				cli.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(lines) < tc.minLines {
				t.Fatalf("said %q while waiting, want at least %d lines", lines, tc.minLines)
			}
			for _, l := range lines {
				if !strings.HasPrefix(l, "waiting for etcd at 127.0.0.1:1 (") {
					t.Fatalf("said %q while waiting", l)
				}
			}
		})
	}
}
