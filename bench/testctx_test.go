package bench

import (
	"context"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// testWait bounds a test's blocking calls: far above what a loaded machine
// needs, far below go test's timeout. A call cut short returns an error
// that names the benchmark ("bench: ...") and the deadline.
const testWait = 2 * time.Minute

// testContext ends with the test, and after testWait at the latest, so
// that a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB) context.Context { return testwait.Context(t, testWait) }
