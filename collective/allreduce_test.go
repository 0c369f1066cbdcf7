package collective

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"
)

// propertySizes are element counts: empty, one, primes, sizes not divisible by
// any world size, and one above a segment.
var propertySizes = []int{0, 1, 2, 3, 7, 13, 97, 1009, 4099, 65537}

func randomInput[T Float](rank, n int, seed uint64) []T {
	rng := rand.New(rand.NewPCG(seed, uint64(rank)))
	x := make([]T, n)
	for i := range x {
		x[i] = T(rng.NormFloat64())
	}
	return x
}

// reference combines the inputs in float64.
func reference[T Float](inputs [][]T, op ReduceOp) []float64 {
	out := make([]float64, len(inputs[0]))
	for i := range out {
		acc := float64(inputs[0][i])
		for _, in := range inputs[1:] {
			v := float64(in[i])
			switch op {
			case Sum, Avg:
				acc += v
			case Min:
				acc = math.Min(acc, v)
			case Max:
				acc = math.Max(acc, v)
			}
		}
		if op == Avg {
			acc /= float64(len(inputs))
		}
		out[i] = acc
	}
	return out
}

func tolerance[T Float](world int) float64 {
	var z T
	if unsafe.Sizeof(z) == 4 {
		return 1e-5 * float64(world)
	}
	return 1e-12 * float64(world)
}

// checkAllReduce runs one allreduce on every rank and checks the result
// against the float64 reference and across ranks, bit for bit.
func checkAllReduce[T Float](t *testing.T, groups []*Group, n int, op ReduceOp, algo Algorithm, seed uint64) {
	t.Helper()
	world := len(groups)
	inputs := make([][]T, world)
	results := make([][]T, world)
	for r := range groups {
		inputs[r] = randomInput[T](r, n, seed)
		results[r] = append([]T(nil), inputs[r]...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
		return g.AllReduceWith(ctx, Of(results[r]), op, algo)
	}))
	want := reference(inputs, op)
	tol := tolerance[T](world)
	for i, w := range want {
		if got := float64(results[0][i]); math.Abs(got-w) > tol*max(1, math.Abs(w)) {
			t.Fatalf("n=%d world=%d %v %v: element %d = %v, reference %v", n, world, op, algo, i, got, w)
		}
	}
	for r := 1; r < world; r++ {
		a, b := bytesOf(results[0]), bytesOf(results[r])
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("n=%d world=%d %v %v: rank %d differs from rank 0 at byte %d", n, world, op, algo, r, i)
			}
		}
	}
}

func TestAllReduceProperties(t *testing.T) {
	for world := 1; world <= 8; world++ {
		groups := inprocGroups(t, world, 1, Options{SegmentBytes: 4096})
		for _, algo := range []Algorithm{AlgoRing, AlgoRecursiveDoubling, AlgoAuto} {
			for _, n := range propertySizes {
				for _, op := range []ReduceOp{Sum, Avg, Min, Max} {
					checkAllReduce[float32](t, groups, n, op, algo, uint64(n*31+int(op)))
					checkAllReduce[float64](t, groups, n, op, algo, uint64(n*37+int(op)))
				}
			}
		}
	}
}

// TestAllReduceLarge moves 64 MiB of float32 through every world size. Under
// the race detector, which makes it slow, only N = 3 and 4 run; the plain test
// run that follows covers all.
func TestAllReduceLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB allreduce skipped in -short mode")
	}
	worlds := []int{1, 2, 3, 4, 5, 6, 7, 8}
	if raceEnabled {
		worlds = []int{3, 4}
	}
	for _, world := range worlds {
		groups := inprocGroups(t, world, 1, Options{})
		checkAllReduce[float32](t, groups, 16<<20, Sum, AlgoAuto, 64)
	}
}

// TestSpecialValues: NaN, infinities and signed zeros reduce to the same bits
// on every rank whatever the order of the pairs.
func TestSpecialValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negZero := float32(math.Copysign(0, -1))
	rows := [][]float32{
		{nan, 1, 0, inf, -inf},
		{1, nan, negZero, 1, inf},
		{negZero, 2, 0, -inf, 3},
	}
	for _, algo := range []Algorithm{AlgoRing, AlgoRecursiveDoubling} {
		for _, op := range []ReduceOp{Sum, Min, Max} {
			groups := inprocGroups(t, len(rows), 1, Options{})
			res := make([][]float32, len(rows))
			mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
				res[r] = append([]float32(nil), rows[r]...)
				return g.AllReduceWith(testContext(t), Float32s(res[r]), op, algo)
			}))
			for r := 1; r < len(rows); r++ {
				for i := range res[0] {
					if math.Float32bits(res[0][i]) != math.Float32bits(res[r][i]) {
						t.Fatalf("%v %v: element %d: rank 0 %v, rank %d %v", algo, op, i, res[0][i], r, res[r][i])
					}
				}
			}
			if op == Min && !math.Signbit(float64(res[0][2])) {
				t.Errorf("min(0, -0, 0) = +0, want -0")
			}
		}
	}
}
