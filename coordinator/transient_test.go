package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestIsTransient(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"request timed out", rpctypes.ErrTimeout, true},
		{"no leader", rpctypes.ErrNoLeader, true},
		{"leader changed", rpctypes.ErrLeaderChanged, true},
		{"timed out, leader failed", rpctypes.ErrTimeoutDueToLeaderFail, true},
		{"too many requests", rpctypes.ErrTooManyRequests, true},
		{"wrapped", fmt.Errorf("coordinator: recording the job configuration: %w", rpctypes.ErrTimeout), true},
		{"gRPC unavailable", status.Error(codes.Unavailable, "connection refused"), true},
		{"lease not found", rpctypes.ErrLeaseNotFound, false},
		{"compacted", rpctypes.ErrCompacted, false},
		{"permission denied", rpctypes.ErrPermissionDenied, false},
		{"cancelled", context.Canceled, false},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{"plain", errors.New("etcdserver: request timed out"), false}, // only the typed error counts
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsTransient(tc.err); got != tc.want {
				t.Fatalf("IsTransient(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestRetry(t *testing.T) {
	refused := errors.New("refused by the fence")
	for _, tc := range []struct {
		name      string
		errs      []error // op's answers in turn; the last repeats
		budget    time.Duration
		wantCalls int
		wantErr   error  // errors.Is target; nil for success
		wantText  string // in the error
	}{
		{"first try", []error{nil}, time.Minute, 1, nil, ""},
		{"through an election", []error{rpctypes.ErrNoLeader, rpctypes.ErrTimeout, nil}, time.Minute, 3, nil, ""},
		{"not transient", []error{refused}, time.Minute, 1, refused, ""},
		{"transient then not", []error{rpctypes.ErrLeaderChanged, refused}, time.Minute, 2, refused, ""},
		{"budget spent", []error{rpctypes.ErrTimeout}, 0, 1, rpctypes.ErrTimeout, "still failing after 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls, retried := 0, 0
			err := Retry(context.Background(), tc.budget, func(error) { retried++ }, func(context.Context) error {
				e := tc.errs[min(calls, len(tc.errs)-1)]
				calls++
				return e
			})
			if calls != tc.wantCalls {
				t.Fatalf("%d calls, want %d", calls, tc.wantCalls)
			}
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if tc.wantText != "" && (err == nil || !strings.Contains(err.Error(), tc.wantText)) {
				t.Fatalf("err %v does not say %q", err, tc.wantText)
			}
			for i := range calls {
				if i < calls-1 && !IsTransient(tc.errs[min(i, len(tc.errs)-1)]) {
					t.Fatalf("retried after a non-transient error")
				}
			}
			if want := calls - 1; err == nil && retried != want {
				t.Fatalf("told of %d retries, want %d", retried, want)
			}
		})
	}
	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		err := Retry(ctx, time.Hour, nil, func(context.Context) error {
			cancel()
			return rpctypes.ErrNoLeader
		})
		if !errors.Is(err, context.Canceled) || !errors.Is(err, rpctypes.ErrNoLeader) {
			t.Fatalf("err %v, want the cancellation joined to the last failure", err)
		}
	})
}
