package worker

import (
	"context"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// testContext ends with the test, and after two minutes at the latest, so
// that a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB) context.Context { return testwait.Context(t, 2*time.Minute) }
