package nn

import (
	"fmt"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// The build chooses the BLAS behind every matrix product in nn: blas_gonum.go
// (the default, and any build without cgo) or blas_openblas.go (cgo with the
// openblas tag). Each defines blasImpl, a stateless implementation type, and
// blasName.
var _ blas.Float32 = blasImpl{}

// BLAS names the implementation this binary's matrix products run on, for
// logs and benchmark output: "gonum (pure Go)" or, for example,
// "openblas 0.3.21 Haswell, 1 thread (cgo)".
func BLAS() string { return blasName() }

// CgoBLAS reports whether the matrix products run in a C library through
// cgo (the OpenBLAS build) rather than as Go code. A goroutine in a cgo call
// holds its P only until the runtime's monitor takes it back, so such a
// process wants one P beyond its compute threads (see
// launch.ComputeThreads).
func CgoBLAS() bool { return blasCgo }

// gemm is c = alpha·op(a)·op(b) + beta·c on the build's BLAS; op transposes
// when t is blas.Trans. Shapes that do not fit panic, as blas32.Gemm does.
func gemm(tA, tB blas.Transpose, alpha float32, a, b blas32.General, beta float32, c blas32.General) {
	m, k := a.Rows, a.Cols
	if tA != blas.NoTrans {
		m, k = k, m
	}
	kb, n := b.Rows, b.Cols
	if tB != blas.NoTrans {
		kb, n = n, kb
	}
	if m != c.Rows || n != c.Cols || k != kb {
		panic(fmt.Sprintf("nn: gemm of %dx%d by %dx%d into %dx%d", m, k, kb, n, c.Rows, c.Cols))
	}
	blasImpl{}.Sgemm(tA, tB, m, n, k, alpha, a.Data, a.Stride, b.Data, b.Stride, beta, c.Data, c.Stride)
}
