package collective

import "math"

// reduceInto sets dst[i] = dst[i] op src[i]. Every kernel is commutative to the
// bit (NaN is canonical, min/max pick a fixed sign for ±0), so two ranks that
// combine the same pair in opposite order still agree bitwise.
func reduceInto(dt DType, op ReduceOp, dst, src []byte) {
	switch dt {
	case Float32:
		d, s := f32s(dst), f32s(src)
		if op == Sum || op == Avg {
			n := sumF32Asm(d, s)
			d, s = d[n:], s[n:]
		}
		reduceSlice(op, d, s)
	case Float64:
		d, s := f64s(dst), f64s(src)
		if op == Sum || op == Avg {
			n := sumF64Asm(d, s)
			d, s = d[n:], s[n:]
		}
		reduceSlice(op, d, s)
	case Float16, BFloat16:
		reduceHalf(dt, op, u16s(dst), u16s(src))
	}
}

// scaleDiv divides every element by n (the last step of Avg).
func scaleDiv(dt DType, b []byte, n int) {
	switch dt {
	case Float32:
		x, d := f32s(b), float32(n)
		for i := range x {
			x[i] /= d
		}
	case Float64:
		x, d := f64s(b), float64(n)
		for i := range x {
			x[i] /= d
		}
	case Float16, BFloat16:
		x, d := u16s(b), float32(n)
		for i := range x {
			x[i] = f32ToHalf(dt, halfToF32(dt, x[i])/d)
		}
	}
}

// reduceHalf is reduceInto for the 16-bit wire types: both operands are
// widened to float32 (exactly), combined there as float32 elements are, and
// the result is rounded back to nearest even. float32 carries more than twice
// the wire types' precision plus two bits, so a sum rounded to float32 first
// still rounds to the correctly rounded 16-bit sum. A NaN result is stored as
// the canonical quiet NaN, so the kernel is commutative to the bit even where
// the hardware's choice between two NaN payloads depends on operand order.
func reduceHalf(dt DType, op ReduceOp, dst, src []uint16) {
	src = src[:len(dst)]
	n := 0
	switch {
	case op != Sum && op != Avg:
	case dt == Float16:
		n = sumF16Asm(dst, src)
	default:
		n = sumBF16Asm(dst, src)
	}
	reduceHalfGo(dt, op, dst[n:], src[n:])
}

// reduceHalfGo is reduceHalf in Go, for what the assembly kernels leave.
func reduceHalfGo(dt DType, op ReduceOp, dst, src []uint16) {
	src = src[:len(dst)]
	switch {
	case dt == Float16 && (op == Sum || op == Avg):
		for i, b := range src {
			s := math.Float32frombits(f16ToF32Bits(dst[i])) + math.Float32frombits(f16ToF32Bits(b))
			if s != s {
				s = math.Float32frombits(canonNaN32)
			}
			dst[i] = f32ToF16Bits(math.Float32bits(s))
		}
	case dt == BFloat16 && (op == Sum || op == Avg):
		for i, b := range src {
			s := math.Float32frombits(uint32(dst[i])<<16) + math.Float32frombits(uint32(b)<<16)
			if s != s {
				s = math.Float32frombits(canonNaN32)
			}
			dst[i] = f32ToBF16Bits(math.Float32bits(s))
		}
	case dt == Float16 && op == Min:
		for i, b := range src {
			dst[i] = f32ToF16Bits(math.Float32bits(minOf(math.Float32frombits(f16ToF32Bits(dst[i])), math.Float32frombits(f16ToF32Bits(b)))))
		}
	case dt == Float16 && op == Max:
		for i, b := range src {
			dst[i] = f32ToF16Bits(math.Float32bits(maxOf(math.Float32frombits(f16ToF32Bits(dst[i])), math.Float32frombits(f16ToF32Bits(b)))))
		}
	case op == Min:
		for i, b := range src {
			dst[i] = f32ToBF16Bits(math.Float32bits(minOf(math.Float32frombits(uint32(dst[i])<<16), math.Float32frombits(uint32(b)<<16))))
		}
	case op == Max:
		for i, b := range src {
			dst[i] = f32ToBF16Bits(math.Float32bits(maxOf(math.Float32frombits(uint32(dst[i])<<16), math.Float32frombits(uint32(b)<<16))))
		}
	}
}

// canonNaN32 is the float32 whose rounding gives the wire types' canonical
// quiet NaN (0x7e00 in binary16, 0x7fc0 in bfloat16).
const canonNaN32 = 0x7fc00000

func reduceSlice[T float32 | float64](op ReduceOp, dst, src []T) {
	src = src[:len(dst)]
	switch op {
	case Sum, Avg:
		i := 0
		for ; i+4 <= len(dst); i += 4 {
			d, s := dst[i:i+4:i+4], src[i:i+4:i+4]
			d[0] += s[0]
			d[1] += s[1]
			d[2] += s[2]
			d[3] += s[3]
		}
		for ; i < len(dst); i++ {
			dst[i] += src[i]
		}
	case Min:
		for i := range dst {
			dst[i] = minOf(dst[i], src[i])
		}
	case Max:
		for i := range dst {
			dst[i] = maxOf(dst[i], src[i])
		}
	}
}

func minOf[T float32 | float64](a, b T) T {
	switch {
	case a < b:
		return a
	case b < a:
		return b
	case a == b: // equal, or +0 and -0: -0 wins whatever the order
		if math.Signbit(float64(a)) {
			return a
		}
		return b
	}
	return T(math.NaN())
}

func maxOf[T float32 | float64](a, b T) T {
	switch {
	case a > b:
		return a
	case b > a:
		return b
	case a == b: // +0 wins whatever the order
		if math.Signbit(float64(a)) {
			return b
		}
		return a
	}
	return T(math.NaN())
}
