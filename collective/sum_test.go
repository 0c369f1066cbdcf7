package collective

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"golang.org/x/sys/cpu"
)

// specialBits32 are float32 values whose sums the kernels must get to the
// bit: NaNs with payloads and signs, infinities, signed zeros, subnormals
// and the largest finite values.
var specialBits32 = []uint32{0x7fc00000, 0xffc00001, 0x7f800001, 0x7fa5a5a5, 0x7f800000, 0xff800000, 0, 0x80000000,
	1, 0x807fffff, 0x7f7fffff, 0xff7fffff, 0x3f800000}

var specialBits64 = []uint64{0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000001, 0x7ff0000000000000,
	0xfff0000000000000, 0, 1 << 63, 1, 0x7fefffffffffffff, 0x3ff0000000000000}

// TestSumKernels: Sum through reduceInto (the AVX2 kernels where the CPU has
// them, the Go loop for the tail) gives bitwise what the Go loop alone gives,
// special values included, for lengths around the kernels' strides. The one
// exception is a sum of two NaNs, which must be a NaN: x86 keeps the first
// operand's payload, and which operand the Go compiler puts first is its own
// choice (the race build puts the other). Every rank runs the same code on a
// chunk, and a NaN fails the step anyway.
func TestSumKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	asm := runtime.GOARCH == "amd64" && cpu.X86.HasAVX2
	for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 100, 1000, 4099} {
		// float32
		d32, s32 := make([]float32, n), make([]float32, n)
		for i := range n {
			d32[i], s32[i] = rng.Float32()*2-1, float32(rng.NormFloat64())
			if rng.IntN(4) == 0 {
				d32[i] = math.Float32frombits(specialBits32[rng.IntN(len(specialBits32))])
			}
			if rng.IntN(4) == 0 {
				s32[i] = math.Float32frombits(specialBits32[rng.IntN(len(specialBits32))])
			}
		}
		want := append([]float32(nil), d32...)
		reduceSlice(Sum, want, s32)
		got := append([]float32(nil), d32...)
		reduceInto(Float32, Sum, Float32s(got).Raw(), Float32s(s32).Raw())
		for i := range n {
			if bothNaN(float64(d32[i]), float64(s32[i])) && got[i] != got[i] {
				continue // see TestSumKernels
			}
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("float32, %d elements: element %d: %#08x + %#08x gave %#08x, want %#08x", n, i,
					math.Float32bits(d32[i]), math.Float32bits(s32[i]), math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
		if did := sumF32Asm(append([]float32(nil), d32...), s32); asm && did != n&^31 {
			t.Fatalf("float32, %d elements: the kernel did %d, want %d", n, did, n&^31)
		}
		// float64
		d64, s64 := make([]float64, n), make([]float64, n)
		for i := range n {
			d64[i], s64[i] = rng.Float64()*2-1, rng.NormFloat64()
			if rng.IntN(4) == 0 {
				d64[i] = math.Float64frombits(specialBits64[rng.IntN(len(specialBits64))])
			}
			if rng.IntN(4) == 0 {
				s64[i] = math.Float64frombits(specialBits64[rng.IntN(len(specialBits64))])
			}
		}
		want64 := append([]float64(nil), d64...)
		reduceSlice(Sum, want64, s64)
		got64 := append([]float64(nil), d64...)
		reduceInto(Float64, Sum, Float64s(got64).Raw(), Float64s(s64).Raw())
		for i := range n {
			if bothNaN(d64[i], s64[i]) && got64[i] != got64[i] {
				continue
			}
			if math.Float64bits(got64[i]) != math.Float64bits(want64[i]) {
				t.Fatalf("float64, %d elements: element %d: %#x + %#x gave %#x, want %#x", n, i,
					math.Float64bits(d64[i]), math.Float64bits(s64[i]), math.Float64bits(got64[i]), math.Float64bits(want64[i]))
			}
		}
		if did := sumF64Asm(append([]float64(nil), d64...), s64); asm && did != n&^15 {
			t.Fatalf("float64, %d elements: the kernel did %d, want %d", n, did, n&^15)
		}
	}
}

func bothNaN(a, b float64) bool { return math.IsNaN(a) && math.IsNaN(b) }

// BenchmarkSum: a 256 KiB float32 sum, through reduceInto (the kernel) and
// the Go loop.
func BenchmarkSum(b *testing.B) {
	const n = 64 << 10
	d, s := make([]float32, n), make([]float32, n)
	for name, f := range map[string]func(){
		"kernel": func() { reduceInto(Float32, Sum, Float32s(d).Raw(), Float32s(s).Raw()) },
		"go":     func() { reduceSlice(Sum, d, s) },
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(n * 4)
			for b.Loop() {
				f()
			}
		})
	}
}
