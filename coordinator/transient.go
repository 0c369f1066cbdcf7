package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Transient etcd errors: what a request meets while the cluster elects a
// leader, while a member is paused or restarting, or while the client
// reconnects. The same request, sent again, can succeed.

// IsTransient reports whether err is an etcd error that the same request
// can outlive: no leader, leader changed, request timed out, too many
// requests, or the member unreachable. A context's own end, a failed
// comparison and a refused request are not.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return transientCode(ee.Code())
	}
	if s, ok := status.FromError(err); ok {
		return transientCode(s.Code())
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return transientCode(se.GRPCStatus().Code())
	}
	return false
}

func transientCode(c codes.Code) bool {
	return c == codes.Unavailable || c == codes.ResourceExhausted
}

// Retry runs op until it succeeds, fails with an error that is not
// transient (returned as it is), or keeps failing transiently for longer
// than budget (the last error returned, wrapped, naming the budget). It
// waits 50 ms after the first failure, doubling to 1 s. onRetry, when not
// nil, is told of each transient failure before the wait. ctx ending stops
// it with ctx's error joined to the last failure.
//
// Only idempotent requests may be retried: a request whose answer was lost
// may have been applied.
func Retry(ctx context.Context, budget time.Duration, onRetry func(error), op func(context.Context) error) error {
	deadline := time.NewTimer(budget)
	defer deadline.Stop()
	wait := 50 * time.Millisecond
	for {
		err := op(ctx)
		if err == nil || !IsTransient(err) {
			return err
		}
		if onRetry != nil {
			onRetry(err)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-deadline.C:
			t.Stop()
			return fmt.Errorf("etcd still failing after %s: %w", budget, err)
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ctx.Err(), err)
		}
		wait = min(2*wait, time.Second)
	}
}

// putBudget bounds the retries of the idempotent writes below (a put or a
// delete of one key): an etcd election lasts a second or two.
const putBudget = 30 * time.Second

// idempotent runs a write that may be sent twice (a put of one value, a
// delete) through Retry within putBudget.
func idempotent(ctx context.Context, op func(context.Context) error) error {
	return Retry(ctx, putBudget, nil, op)
}
