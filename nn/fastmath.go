package nn

import "math"

// Elementwise float32 exp and tanh for the activations' hot loops: the
// standard library's work in float64 through branches a float32 network
// does not need. Exp32 reduces x = n·ln2 + r (|r| ≤ ln2/2, ln2 split in
// two parts so that r is exact), takes e^r from its Taylor polynomial of
// degree 6 (truncation below 1.2e-7 relative, under float32's half ulp
// for most r) and scales by 2^n through the exponent bits. tanh32 is
// (1 − e^(−2|x|)) / (1 + e^(−2|x|)) with the sign restored: its absolute
// error stays below 2e-7, which is what GELU's 0.5·x·(1 + tanh) needs
// (TestFastMath measures both against math).

const (
	log2e = 1.4426950408889634
	ln2Hi = 0.693145751953125      // ln 2's leading bits: n·ln2Hi is exact for |n| < 2^9
	ln2Lo = 1.4286068203094172e-06 // ln 2 − ln2Hi
)

// Exp32 is e^x in float32 (every softmax of the package, and tp's, uses
// it, so that split and whole models agree); e^x below the smallest
// normal float32 flushes to 0.
func Exp32(x float32) float32 {
	switch {
	case x > 88: // 2^n would overflow the exponent bits
		return float32(math.Exp(float64(x)))
	case x < -87.33654:
		return 0
	}
	v := x * log2e
	if v < 0 {
		return expAt(x, int32(v-0.5))
	}
	return expAt(x, int32(v+0.5))
}

// expAt is e^x for x = n·ln2 + r, n the nearest integer to x/ln2 (and
// −126 ≤ n ≤ 127).
func expAt(x float32, n int32) float32 {
	fn := float32(n)
	r := (x - fn*ln2Hi) - fn*ln2Lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(n+127)<<23)
}

// tanh32 is tanh(x).
func tanh32(x float32) float32 {
	var t [1]float32
	tanh32s(t[:], []float32{x})
	return t[0]
}

// tanh32s sets dst[i] = tanh(src[i]) (dst may be src), branch-free: the
// signs of a layer's inputs are random, and a mispredicted branch costs
// more than the arithmetic.
func tanh32s(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		a := min(math.Float32frombits(math.Float32bits(x)&^(1<<31)), 9) // |x|; tanh(9) rounds to 1
		v := -2 * a                                                     // in [-18, 0]
		q := expAt(v, int32(v*log2e-0.5))
		t := (1 - q) / (1 + q)
		dst[i] = math.Float32frombits(math.Float32bits(t) | math.Float32bits(x)&(1<<31))
	}
}
