//go:build !(cgo && openblas)

package nn

import "testing"

// blasAllocates: gonum's parallel Sgemm allocates its goroutines.
const blasAllocates = true

func TestPureGoBuild(t *testing.T) {
	if got := BLAS(); got != "gonum (pure Go)" {
		t.Errorf("BLAS() = %q in the pure-Go build", got)
	}
}
