package nn

import (
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// BenchmarkSGEMM times the three products of the MLP's first layer
// (784→512) at batch 256, in this build's BLAS (see BLAS()): the forward
// x·W, the weight gradient xᵀ·dy and the input gradient dy·Wᵀ. bench/sgemm.sh
// runs the same shapes in OpenBLAS called directly from C.
func BenchmarkSGEMM(b *testing.B) {
	b.Logf("BLAS: %s", BLAS())
	rng := rand.New(rand.NewPCG(1, 1))
	mat := func(rows, cols int) blas32.General {
		g := blas32.General{Rows: rows, Cols: cols, Stride: cols, Data: make([]float32, rows*cols)}
		for i := range g.Data {
			g.Data[i] = float32(rng.NormFloat64())
		}
		return g
	}
	const batch, in, out = 256, 784, 512
	x, w, dy := mat(batch, in), mat(in, out), mat(batch, out)
	for _, bc := range []struct {
		name   string
		tA, tB blas.Transpose
		a, b   blas32.General
		c      blas32.General
	}{
		{"forward-256x784x512", blas.NoTrans, blas.NoTrans, x, w, mat(batch, out)},
		{"grad-weights-784x256x512", blas.Trans, blas.NoTrans, x, dy, mat(in, out)},
		{"grad-input-256x512x784", blas.NoTrans, blas.Trans, dy, w, mat(batch, in)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			k := bc.a.Cols
			if bc.tA != blas.NoTrans {
				k = bc.a.Rows
			}
			flops := 2 * float64(bc.c.Rows) * float64(bc.c.Cols) * float64(k)
			for b.Loop() {
				gemm(bc.tA, bc.tB, 1, bc.a, bc.b, 0, bc.c)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkMLPStep is one rank's compute in a training step of the README's
// MLP (784-512-512-10, batch 256): forward, loss and backward, no allreduce.
// Profile it with -cpuprofile.
func BenchmarkMLPStep(b *testing.B) {
	b.Logf("BLAS: %s", BLAS())
	m := newMLP([]int{784, 512, 512, 10}, 256, 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.step(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(m.x.Rows)*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
}
