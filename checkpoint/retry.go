package checkpoint

import (
	"context"
	"time"
)

// Backoff is how a store operation is retried: after a failure, wait First,
// then twice as long each time up to Max, until the context ends. Errors no
// retry can mend are returned at once.
type Backoff struct {
	First, Max time.Duration
}

// DefaultBackoff retries after 100 ms, doubling to 5 s.
var DefaultBackoff = Backoff{First: 100 * time.Millisecond, Max: 5 * time.Second}

// do runs op until it succeeds, fails permanently or ctx ends; onRetry is
// told of each failure that will be retried.
func (b Backoff) do(ctx context.Context, op func(context.Context) error, onRetry func(attempt int, err error)) error {
	wait := b.First
	for attempt := 1; ; attempt++ {
		err := op(ctx)
		if err == nil || isPermanent(err) {
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		if onRetry != nil {
			onRetry(attempt, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, b.Max)
	}
}
