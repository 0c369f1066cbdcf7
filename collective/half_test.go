package collective

import (
	"math"
	"math/rand/v2"
	"testing"
)

// halfFormat describes a 16-bit binary format for the slow references, which
// follow the definition of the format rather than the kernels' bit tricks.
type halfFormat struct {
	dt        DType
	expBits   uint // exponent field width
	mantBits  uint // stored mantissa bits
	bias      int  // exponent bias
	toHalf    func(dst []uint16, src []float32)
	fromHalf  func(dst []float32, src []uint16)
	toGo      func(dst []uint16, src []float32) // the Go kernels alone
	fromGo    func(dst []float32, src []uint16)
	quietMask uint16 // the quiet bit of a NaN
}

// halfImpl is one implementation of a format's conversions: the exported
// functions (the assembly kernels where the CPU has them) or the Go ones.
type halfImpl struct {
	name     string
	toHalf   func(dst []uint16, src []float32)
	fromHalf func(dst []float32, src []uint16)
}

func (f halfFormat) impls() []halfImpl {
	return []halfImpl{{"exported", f.toHalf, f.fromHalf}, {"go", f.toGo, f.fromGo}}
}

var (
	fp16Format = halfFormat{dt: Float16, expBits: 5, mantBits: 10, bias: 15, toHalf: ToFloat16, fromHalf: FromFloat16, toGo: toFloat16Go, fromGo: fromFloat16Go, quietMask: 0x200}
	bf16Format = halfFormat{dt: BFloat16, expBits: 8, mantBits: 7, bias: 127, toHalf: ToBFloat16, fromHalf: FromBFloat16, toGo: toBFloat16Go, fromGo: fromBFloat16Go, quietMask: 0x40}
)

func (f halfFormat) expMax() uint16 { return 1<<f.expBits - 1 }

// refWiden is the value of bit pattern h by the definition: (−1)^s ·
// 2^(e−bias) · 1.m for a normal, (−1)^s · 2^(1−bias) · 0.m for a subnormal,
// ±Inf, and a NaN of the same sign whose payload is m in float32's top bits
// (quiet for binary16).
func (f halfFormat) refWiden(h uint16) uint32 {
	s := h >> 15
	e := h >> f.mantBits & f.expMax()
	m := h & (1<<f.mantBits - 1)
	if e == f.expMax() {
		bits := uint32(s)<<31 | 0xff<<23 | uint32(m)<<(23-f.mantBits)
		if m != 0 && f.dt == Float16 { // a binary16 NaN widens quiet
			bits |= 1 << 22
		}
		return bits
	}
	var v float64
	if e == 0 {
		v = math.Ldexp(float64(m), 1-f.bias-int(f.mantBits))
	} else {
		v = math.Ldexp(float64(m)+float64(uint(1)<<f.mantBits), int(e)-f.bias-int(f.mantBits))
	}
	if s == 1 {
		v = -v
	}
	return math.Float32bits(float32(v)) // exact: every such value is a float32
}

// refRound rounds float32 bits to the format by the definition: the nearest
// representable value, ties to the even mantissa, ±Inf past the largest
// finite value plus half an ulp; a NaN keeps its sign and payload top, quiet.
func (f halfFormat) refRound(b uint32) uint16 {
	x := math.Float32frombits(b)
	sign := uint16(b>>31) << 15
	if math.IsNaN(float64(x)) {
		return sign | f.expMax()<<f.mantBits | f.quietMask | uint16(b&0x7fffff>>(23-f.mantBits))
	}
	v := math.Abs(float64(x))
	emin := 1 - f.bias                   // exponent of the smallest normal
	emax := int(f.expMax()) - 1 - f.bias // of the largest
	p := int(f.mantBits)
	maxFinite := math.Ldexp(2-math.Ldexp(1, -p), emax)
	if math.IsInf(float64(x), 0) || v >= maxFinite+math.Ldexp(1, emax-p-1) {
		return sign | f.expMax()<<f.mantBits
	}
	if v == 0 {
		return sign
	}
	_, e2 := math.Frexp(v) // v = fr·2^e2, fr in [0.5, 1)
	e := max(e2-1, emin)   // exponent of v's binade, clamped to the subnormals'
	ulp := math.Ldexp(1, e-p)
	q := math.RoundToEven(v / ulp) // exact: v has 24 bits, the quotient is a scaling
	r := q * ulp
	if r == 0 {
		return sign
	}
	_, re := math.Frexp(r)
	re--
	if re < emin { // subnormal
		return sign | uint16(r/math.Ldexp(1, emin-p))
	}
	if re > emax {
		return sign | f.expMax()<<f.mantBits
	}
	m := uint16((r/math.Ldexp(1, re) - 1) * float64(uint(1)<<p))
	return sign | uint16(re+f.bias)<<f.mantBits | m
}

// TestHalfWidenExhaustive: every one of the 65,536 patterns of both formats
// widens to the float32 the definition gives, and rounds back to itself (a
// signalling NaN comes back quiet).
func TestHalfWidenExhaustive(t *testing.T) {
	for _, f := range []halfFormat{fp16Format, bf16Format} {
		for _, impl := range f.impls() {
			t.Run(f.dt.String()+"/"+impl.name, func(t *testing.T) {
				all := make([]uint16, 1<<16)
				for i := range all {
					all[i] = uint16(i)
				}
				wide := make([]float32, len(all))
				back := make([]uint16, len(all))
				impl.fromHalf(wide, all)
				impl.toHalf(back, wide)
				for i, h := range all {
					if got, want := math.Float32bits(wide[i]), f.refWiden(h); got != want {
						t.Fatalf("widen %#04x = %#08x, want %#08x", h, got, want)
					}
					if got := math.Float32bits(halfToF32(f.dt, h)); got != f.refWiden(h) {
						t.Fatalf("scalar widen %#04x = %#08x", h, got)
					}
					want := h
					if h&0x7fff>>f.mantBits == f.expMax() && h&(1<<f.mantBits-1) != 0 {
						want |= f.quietMask
					}
					if back[i] != want {
						t.Fatalf("round trip of %#04x gave %#04x, want %#04x", h, back[i], want)
					}
				}
			})
		}
	}
}

// halfEdgeInputs lists float32 bit patterns where rounding is delicate: for
// every finite 16-bit value, itself, its float32 neighbours, the exact
// midpoints to the next value (ties) and their neighbours; then zeros,
// infinities, NaNs, the overflow boundary, the float32 extremes.
func halfEdgeInputs(f halfFormat) []uint32 {
	var in []uint32
	for h := range 1 << 15 {
		if uint16(h)>>f.mantBits == f.expMax() {
			continue
		}
		lo := f.refWiden(uint16(h))
		hi := f.refWiden(uint16(h + 1)) // the next pattern up (Inf after the largest)
		mid := math.Float32bits(float32((float64(math.Float32frombits(lo)) + float64(math.Float32frombits(hi))) / 2))
		if hi == f32Inf {
			mid = math.Float32bits(math.Float32frombits(lo) + (math.Float32frombits(lo)-math.Float32frombits(f.refWiden(uint16(h-1))))/2)
		}
		for _, b := range []uint32{lo, lo + 1, lo - 1, mid, mid - 1, mid + 1} {
			in = append(in, b, b|0x80000000)
		}
	}
	in = append(in, 0, 0x80000000, 1, 0x80000001, f32Inf, 0xff800000, 0x7f7fffff, 0xff7fffff,
		0x7fc00000, 0xffc00000, 0x7f800001, 0x7fbfffff, 0xff800001, 0x7fffffff, 0x00800000, 0x007fffff,
		math.Float32bits(65504), math.Float32bits(65519.99), math.Float32bits(65520), math.Float32bits(65536), math.Float32bits(1e30))
	return in
}

// TestHalfRound: rounding float32 to both formats matches the definition on
// the edge cases and on a million random bit patterns.
func TestHalfRound(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 16))
	for _, f := range []halfFormat{fp16Format, bf16Format} {
		t.Run(f.dt.String(), func(t *testing.T) {
			in := halfEdgeInputs(f)
			for range 1 << 20 {
				in = append(in, rng.Uint32())
			}
			for range 1 << 18 { // concentrated where the format's values are
				e := uint32(127-f.bias-int(f.mantBits)-2) + rng.Uint32N(uint32(2*f.bias+int(f.mantBits)+4))
				in = append(in, rng.Uint32()&0x807fffff|min(e, 0xff)<<23)
			}
			src := make([]float32, len(in))
			for i, b := range in {
				src[i] = math.Float32frombits(b)
			}
			for _, impl := range f.impls() {
				for _, n := range []int{len(src), len(src) - 5, 11, 3, 1} { // vector loops and their tails
					got := make([]uint16, n)
					impl.toHalf(got, src[:n])
					for i := range n {
						if want := f.refRound(in[i]); got[i] != want {
							t.Fatalf("%s: round %#08x (%g) = %#04x, want %#04x", impl.name, in[i], src[i], got[i], want)
						}
					}
				}
			}
			for _, b := range in[:1000] {
				if got, want := f32ToHalf(f.dt, math.Float32frombits(b)), f.refRound(b); got != want {
					t.Fatalf("scalar round %#08x = %#04x, want %#04x", b, got, want)
				}
			}
		})
	}
}

// TestHalfRefSpotChecks pins the references themselves on values known from
// the formats' definitions.
func TestHalfRefSpotChecks(t *testing.T) {
	cases := []struct {
		f    halfFormat
		in   float32
		want uint16
	}{
		{fp16Format, 1, 0x3c00},
		{fp16Format, -2, 0xc000},
		{fp16Format, 65504, 0x7bff},
		{fp16Format, 65519, 0x7bff},
		{fp16Format, 65520, 0x7c00},
		{fp16Format, 0x1p-24, 0x0001},
		{fp16Format, 0x1p-25, 0x0000},     // tie to even: zero
		{fp16Format, 0x1.8p-24, 0x0002},   // tie to even: 2
		{fp16Format, 0x1.ff8p-15, 0x03ff}, // the largest subnormal
		{fp16Format, 0x1.ffcp-15, 0x0400}, // it plus half an ulp: ties up to 2^-14
		{fp16Format, 1 + 0x1p-11, 0x3c00}, // tie to even: down
		{fp16Format, 1 + 0x3p-11, 0x3c02}, // tie to even: up
		{fp16Format, 0.1, 0x2e66},
		{bf16Format, 1, 0x3f80},
		{bf16Format, 1 + 0x1p-8, 0x3f80},
		{bf16Format, 1 + 0x3p-8, 0x3f82},
		{bf16Format, math.MaxFloat32, 0x7f80},
		{bf16Format, 0.1, 0x3dcd},
	}
	for _, c := range cases {
		b := math.Float32bits(c.in)
		if got := c.f.refRound(b); got != c.want {
			t.Errorf("%s reference round %g = %#04x, want %#04x", c.f.dt, c.in, got, c.want)
		}
		if got := f32ToHalf(c.f.dt, c.in); got != c.want {
			t.Errorf("%s round %g = %#04x, want %#04x", c.f.dt, c.in, got, c.want)
		}
	}
}

// TestReduceHalf: the 16-bit kernels give the correctly rounded float32
// combination of the widened operands, are commutative to the bit (NaNs
// included), and scaleDiv divides in float32.
func TestReduceHalf(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 1 << 16
	for _, f := range []halfFormat{fp16Format, bf16Format} {
		for _, op := range []ReduceOp{Sum, Avg, Min, Max} {
			t.Run(f.dt.String()+"/"+op.String(), func(t *testing.T) {
				a, b := make([]uint16, n+3), make([]uint16, n+3)
				for i := range a {
					a[i], b[i] = uint16(rng.Uint32()), uint16(rng.Uint32())
					if i%3 == 0 { // close magnitudes, so sums do not just return the larger
						b[i] = a[i] ^ uint16(rng.Uint32N(64))
					}
				}
				ab, ba := append([]uint16(nil), a...), append([]uint16(nil), b...)
				reduceInto(f.dt, op, bytesOf(ab), bytesOf(b))
				reduceInto(f.dt, op, bytesOf(ba), bytesOf(a))
				abGo := append([]uint16(nil), a...)
				reduceHalfGo(f.dt, op, abGo, b)
				for i := range a {
					if ab[i] != abGo[i] {
						t.Fatalf("%#04x %s %#04x = %#04x, the Go kernel gives %#04x", a[i], op, b[i], ab[i], abGo[i])
					}
					if ab[i] != ba[i] {
						t.Fatalf("%#04x %s %#04x = %#04x one way, %#04x the other", a[i], op, b[i], ab[i], ba[i])
					}
					x, y := math.Float32frombits(f.refWiden(a[i])), math.Float32frombits(f.refWiden(b[i]))
					var r float32
					switch op {
					case Sum, Avg:
						r = x + y
					case Min:
						r = minOf(x, y)
					case Max:
						r = maxOf(x, y)
					}
					want := f.refRound(math.Float32bits(r))
					if r != r {
						want = f.refRound(canonNaN32)
					}
					if ab[i] != want {
						t.Fatalf("%#04x %s %#04x = %#04x, want %#04x", a[i], op, b[i], ab[i], want)
					}
				}
			})
		}
		t.Run(f.dt.String()+"/div", func(t *testing.T) {
			x := []uint16{f32ToHalf(f.dt, 3), f32ToHalf(f.dt, -1), f32ToHalf(f.dt, 0.3)}
			scaleDiv(f.dt, bytesOf(x), 3)
			for i, want := range []float32{1, -1.0 / 3, 0.3 / 3} {
				if got := halfToF32(f.dt, x[i]); got != halfToF32(f.dt, f32ToHalf(f.dt, halfToF32(f.dt, f32ToHalf(f.dt, want*3))/3)) {
					t.Errorf("element %d: %g", i, got)
				}
			}
		})
	}
}

// TestHalfFeedbackKernels: the error-feedback and dividing kernels give the
// Go kernels' bits (assembly and Go paths agree), the residue is exactly what
// rounding lost, and a value that overflows leaves a zero residue.
func TestHalfFeedbackKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 1<<12 + 5
	for _, f := range []halfFormat{fp16Format, bf16Format} {
		t.Run(f.dt.String(), func(t *testing.T) {
			src, res := make([]float32, n), make([]float32, n)
			for i := range src {
				src[i] = float32(rng.NormFloat64() * math.Ldexp(1, int(rng.IntN(40))-30))
				res[i] = float32(rng.NormFloat64() * 1e-6)
			}
			src[0], src[1], src[2], src[3] = 1e6, float32(math.Inf(-1)), float32(math.NaN()), math.MaxFloat32
			resGo := append([]float32(nil), res...)
			dst, dstGo := make([]uint16, n), make([]uint16, n)
			v := make([]float32, n)
			for i := range v {
				v[i] = src[i] + res[i]
			}
			encodeHalfFeedback(f.dt, dst, src, res)
			encodeHalfFeedbackGo(f.dt, dstGo, src, resGo)
			for i := range src {
				if dst[i] != dstGo[i] || math.Float32bits(res[i]) != math.Float32bits(resGo[i]) {
					t.Fatalf("element %d (%g): %#04x residue %g, the Go kernel %#04x residue %g", i, src[i], dst[i], res[i], dstGo[i], resGo[i])
				}
				if dst[i] != f.refRound(math.Float32bits(v[i])) {
					t.Fatalf("element %d: %#04x, want %#04x", i, dst[i], f.refRound(math.Float32bits(v[i])))
				}
				w := float64(math.Float32frombits(f.refWiden(dst[i])))
				want := float32(float64(v[i]) - w)
				if math.IsInf(w, 0) || math.IsNaN(w) {
					want = 0
				}
				if res[i] != want {
					t.Fatalf("element %d (%g): residue %g, want %g", i, v[i], res[i], want)
				}
			}
			if f.dt == Float16 && res[0] != 0 {
				t.Errorf("1e6 overflows binary16 and left residue %g", res[0])
			}
			for _, div := range []float32{1, 3} {
				out, outGo := make([]float32, n), make([]float32, n)
				decodeHalf(f.dt, out, dst, div)
				f.fromGo(outGo, dst)
				for i := range outGo {
					outGo[i] /= div
					if math.Float32bits(out[i]) != math.Float32bits(outGo[i]) && !(out[i] != out[i] && outGo[i] != outGo[i]) {
						t.Fatalf("decode /%g element %d: %g, want %g", div, i, out[i], outGo[i])
					}
				}
			}
		})
	}
}

func benchConvert(b *testing.B, n int, f func(dst16 []uint16, dst32, src []float32)) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 1e-3) // gradient-like: many fp16 subnormals
	}
	dst16, dst32 := make([]uint16, n), make([]float32, n)
	b.SetBytes(int64(n) * 4)
	b.ResetTimer()
	for b.Loop() {
		f(dst16, dst32, src)
	}
}

// BenchmarkHalfConvert measures the conversion and reduction kernels, the
// exported ones (AVX2 and F16C where the CPU has them) and the Go ones, on
// 2^20 gradient-like elements; MB/s counts 4 bytes per element (the float32
// gradient bytes handled), whatever the kernel reads and writes.
func BenchmarkHalfConvert(b *testing.B) {
	const n = 1 << 20
	b.Run("ToFloat16", func(b *testing.B) { benchConvert(b, n, func(d16 []uint16, _, s []float32) { ToFloat16(d16, s) }) })
	b.Run("FromFloat16", func(b *testing.B) {
		benchConvert(b, n, func(d16 []uint16, d32, _ []float32) { FromFloat16(d32, d16) })
	})
	b.Run("ToBFloat16", func(b *testing.B) { benchConvert(b, n, func(d16 []uint16, _, s []float32) { ToBFloat16(d16, s) }) })
	b.Run("FromBFloat16", func(b *testing.B) {
		benchConvert(b, n, func(d16 []uint16, d32, _ []float32) { FromBFloat16(d32, d16) })
	})
	b.Run("ReduceFloat16", func(b *testing.B) {
		benchConvert(b, n, func(d16 []uint16, _, _ []float32) { reduceHalf(Float16, Sum, d16, d16) })
	})
	b.Run("ReduceBFloat16", func(b *testing.B) {
		benchConvert(b, n, func(d16 []uint16, _, _ []float32) { reduceHalf(BFloat16, Sum, d16, d16) })
	})
	b.Run("ToFloat16Go", func(b *testing.B) { benchConvert(b, n, func(d16 []uint16, _, s []float32) { toFloat16Go(d16, s) }) })
	b.Run("FromFloat16Go", func(b *testing.B) {
		benchConvert(b, n, func(d16 []uint16, d32, _ []float32) { fromFloat16Go(d32, d16) })
	})
	b.Run("ToBFloat16Go", func(b *testing.B) { benchConvert(b, n, func(d16 []uint16, _, s []float32) { toBFloat16Go(d16, s) }) })
	b.Run("ReduceFloat16Go", func(b *testing.B) {
		benchConvert(b, n, func(d16 []uint16, _, _ []float32) { reduceHalfGo(Float16, Sum, d16, d16) })
	})
	b.Run("ReduceBFloat16Go", func(b *testing.B) {
		benchConvert(b, n, func(d16 []uint16, _, _ []float32) { reduceHalfGo(BFloat16, Sum, d16, d16) })
	})
	b.Run("FeedbackFloat16", func(b *testing.B) {
		res := make([]float32, n)
		benchConvert(b, n, func(d16 []uint16, _, s []float32) { encodeHalfFeedback(Float16, d16, s, res) })
	})
	b.Run("FeedbackBFloat16", func(b *testing.B) {
		res := make([]float32, n)
		benchConvert(b, n, func(d16 []uint16, _, s []float32) { encodeHalfFeedback(BFloat16, d16, s, res) })
	})
	b.Run("ReduceFloat32", func(b *testing.B) {
		benchConvert(b, n, func(_ []uint16, d32, s []float32) { reduceSlice(Sum, d32, s) })
	})
}
