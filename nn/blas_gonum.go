//go:build !(cgo && openblas)

package nn

import "gonum.org/v1/gonum/blas/gonum"

// blasImpl is gonum's pure-Go BLAS: the default build, and every build
// without cgo (CGO_ENABLED=0 gives a static binary).
type blasImpl = gonum.Implementation

func blasName() string { return "gonum (pure Go)" }

const blasCgo = false
