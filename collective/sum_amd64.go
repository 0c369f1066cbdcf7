//go:build amd64 && !purego

package collective

import "golang.org/x/sys/cpu"

// The sums of sum_amd64.s run where the CPU has AVX2; each wrapper returns
// how many leading elements it did and leaves the rest to the Go loop. Both
// give the same bits but for which NaN a sum of two NaNs keeps (see the
// assembly's comment).

//go:noescape
func sumF32(dst, src *float32, n int)

//go:noescape
func sumF64(dst, src *float64, n int)

func sumF32Asm(dst, src []float32) int {
	n := len(dst) &^ 31
	if n == 0 || !cpu.X86.HasAVX2 {
		return 0
	}
	sumF32(&dst[0], &src[:n][0], n)
	return n
}

func sumF64Asm(dst, src []float64) int {
	n := len(dst) &^ 15
	if n == 0 || !cpu.X86.HasAVX2 {
		return 0
	}
	sumF64(&dst[0], &src[:n][0], n)
	return n
}
