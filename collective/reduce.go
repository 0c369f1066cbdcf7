package collective

import "math"

// reduceInto sets dst[i] = dst[i] op src[i]. Every kernel is commutative to the
// bit (NaN is canonical, min/max pick a fixed sign for ±0), so two ranks that
// combine the same pair in opposite order still agree bitwise.
func reduceInto(dt DType, op ReduceOp, dst, src []byte) {
	switch dt {
	case Float32:
		reduceSlice(op, f32s(dst), f32s(src))
	case Float64:
		reduceSlice(op, f64s(dst), f64s(src))
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
	}
}

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
