package collective

import "math"

// Compressed gradients: float32 tensors travel as Float16 or BFloat16 (half
// the bytes) and are reduced in float32, one rounding to the wire type per
// combining step. The kernels below move whole slices between float32 and a
// wire buffer the caller allocated once; they allocate nothing.

// encodeHalf rounds src into the wire buffer dst of type dt.
func encodeHalf(dt DType, dst []uint16, src []float32) {
	if dt == Float16 {
		ToFloat16(dst, src)
	} else {
		ToBFloat16(dst, src)
	}
}

// encodeHalfFeedback rounds src+res into dst and leaves in res what the
// rounding lost, (src+res) − widen(dst), to be added at the next round: the
// error-feedback scheme of compressed SGD (Seide et al. 2014; Karimireddy et
// al. 2019). A value that rounds to ±Inf or NaN leaves a zero residue, so an
// overflow does not poison the rounds after it.
func encodeHalfFeedback(dt DType, dst []uint16, src, res []float32) {
	dst, res = dst[:len(src)], res[:len(src)]
	var n int
	if dt == Float16 {
		n = feedbackF16Asm(dst, src, res)
	} else {
		n = feedbackBF16Asm(dst, src, res)
	}
	encodeHalfFeedbackGo(dt, dst[n:], src[n:], res[n:])
}

func encodeHalfFeedbackGo(dt DType, dst []uint16, src, res []float32) {
	dst, res = dst[:len(src)], res[:len(src)]
	if dt == Float16 {
		for i, g := range src {
			v := g + res[i]
			h := f32ToF16Bits(math.Float32bits(v))
			r := v - math.Float32frombits(f16ToF32Bits(h))
			if r-r != 0 { // Inf or NaN
				r = 0
			}
			dst[i], res[i] = h, r
		}
		return
	}
	for i, g := range src {
		v := g + res[i]
		h := f32ToBF16Bits(math.Float32bits(v))
		r := v - math.Float32frombits(uint32(h)<<16)
		if r-r != 0 {
			r = 0
		}
		dst[i], res[i] = h, r
	}
}

// decodeHalf widens the wire buffer src of type dt into dst, dividing every
// element by div when div is not 1 (the last step of Avg, done in float32).
func decodeHalf(dt DType, dst []float32, src []uint16, div float32) {
	dst = dst[:len(src)]
	if div == 1 {
		div = 0 // the assembly kernels' "no division"
	}
	var n int
	if dt == Float16 {
		n = f16ToF32Asm(dst, src, div)
		fromFloat16Go(dst[n:], src[n:])
	} else {
		n = bf16ToF32Asm(dst, src, div)
		fromBFloat16Go(dst[n:], src[n:])
	}
	if div != 0 {
		for i := n; i < len(dst); i++ {
			dst[i] /= div
		}
	}
}
