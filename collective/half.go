package collective

import "math"

// Conversions between float32 and the 16-bit wire types. They work on the
// bit patterns with integer arithmetic and selects instead of data-dependent
// branches (gradients are full of values that are subnormal in binary16, so a
// branch per class would mispredict), write into caller-provided slices, and
// allocate nothing.
//
// Rounding is to nearest, ties to even, as IEEE 754 requires: subnormal
// results are rounded correctly, binary16 overflow gives ±Inf (bfloat16 has
// float32's range, so only values within half an ulp of MaxFloat32 round up
// to Inf), ±Inf stays ±Inf, and a NaN stays a NaN of the same sign with the
// top bits of its payload and the quiet bit set. Widening is exact; a binary16
// NaN widens quiet (as the F16C instructions do), a bfloat16 one unchanged.
// So a round trip through float32 gives back every 16-bit pattern except
// that a signalling NaN comes back quiet.

const (
	f16Inf   = 0x7c00
	f16QNaN  = 0x7e00
	bf16QNaN = 0x7fc0
	f32Inf   = 0x7f800000
	// f16Overflow is 65536 as float32: from there on a value is Inf or NaN in
	// binary16 (values from 65520 on round up to Inf in the normal path).
	f16Overflow = (127 + 16) << 23
	// f16MinNormal is 2^-14, the smallest normal binary16, as float32.
	f16MinNormal = (127 - 14) << 23
	// f16Rebias moves a float32 exponent to binary16's bias: (15-127)<<23.
	f16Rebias = 0xc8000000
	// f16SubMagic is 0.5: adding it to a value below 2^-14 leaves the value's
	// binary16 subnormal mantissa, rounded by the FPU to nearest even, in the
	// low bits of the sum.
	f16SubMagic = 126 << 23
)

// f32ToF16Bits rounds a float32, given as its bits, to binary16.
func f32ToF16Bits(b uint32) uint16 {
	x := b & 0x7fffffff
	// Normal range: rebias the exponent, round the 13 dropped bits to nearest
	// even (adding 0xfff plus the kept lowest bit), and shift. A carry out of
	// the mantissa bumps the exponent, up to Inf from 65520 on.
	r := (x + f16Rebias + 0xfff + x>>13&1) >> 13
	// Below 2^-14: the FPU aligns and rounds (an add alone is never fused).
	// Computed whatever x is, so the choice is a conditional move.
	sub := math.Float32bits(math.Float32frombits(x)+0.5) - f16SubMagic
	if x < f16MinNormal {
		r = sub
	}
	if x >= f16Overflow { // rare: Inf, NaN or overflow
		r = f16Inf
		if x > f32Inf { // NaN: 0x7e00 and the payload's top (x>>13 has 0xfc00 set)
			r = (x>>13 | f16QNaN) &^ 0x8000
		}
	}
	return uint16(r | b>>16&0x8000)
}

// f16ToF32Bits widens a binary16, exactly, to float32 bits.
func f16ToF32Bits(h uint16) uint32 {
	x := uint32(h)
	o := x & 0x7fff << 13 // exponent and mantissa, in float32's places
	r := o + (127-15)<<23 // a normal: rebias
	// Zero or subnormal: m·2^-24 is (2^-14 + m·2^-24) − 2^-14, both exact.
	sub := math.Float32bits(math.Float32frombits(o+f16MinNormal) - math.Float32frombits(f16MinNormal))
	if o < 1<<23 { // exponent zero
		r = sub
	}
	if o >= 0x0f800000 { // exponent all ones: Inf, or a NaN made quiet as F16C does
		r = o + (255-31)<<23 | (o&0x7fffff+0x7fffff)>>23<<22
	}
	return r | x&0x8000<<16
}

// f32ToBF16Bits rounds a float32, given as its bits, to bfloat16.
func f32ToBF16Bits(b uint32) uint16 {
	r := (b + 0x7fff + (b >> 16 & 1)) >> 16
	if b&0x7fffffff > f32Inf { // NaN: keep sign and payload top, quiet
		r = b>>16 | 0x40
	}
	return uint16(r)
}

// ToFloat16 rounds src to binary16 into dst, which must be at least as long.
func ToFloat16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	n := f32ToF16Asm(dst, src)
	toFloat16Go(dst[n:], src[n:])
}

// FromFloat16 widens binary16 src into dst, which must be at least as long.
func FromFloat16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	n := f16ToF32Asm(dst, src, 0)
	fromFloat16Go(dst[n:], src[n:])
}

// ToBFloat16 rounds src to bfloat16 into dst, which must be at least as long.
func ToBFloat16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	n := f32ToBF16Asm(dst, src)
	toBFloat16Go(dst[n:], src[n:])
}

// FromBFloat16 widens bfloat16 src into dst, which must be at least as long.
func FromBFloat16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	n := bf16ToF32Asm(dst, src, 0)
	fromBFloat16Go(dst[n:], src[n:])
}

// The Go kernels, for the elements the assembly ones leave (all of them on
// other CPUs).

func toFloat16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = f32ToF16Bits(math.Float32bits(x))
	}
}

func fromFloat16Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = math.Float32frombits(f16ToF32Bits(h))
	}
}

func toBFloat16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = f32ToBF16Bits(math.Float32bits(x))
	}
}

func fromBFloat16Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// halfToF32 widens one element of wire type dt (Float16 or BFloat16).
func halfToF32(dt DType, h uint16) float32 {
	if dt == Float16 {
		return math.Float32frombits(f16ToF32Bits(h))
	}
	return math.Float32frombits(uint32(h) << 16)
}

// f32ToHalf rounds one float32 to wire type dt (Float16 or BFloat16).
func f32ToHalf(dt DType, f float32) uint16 {
	if dt == Float16 {
		return f32ToF16Bits(math.Float32bits(f))
	}
	return f32ToBF16Bits(math.Float32bits(f))
}
