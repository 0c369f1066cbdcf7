//go:build amd64 && !purego

package collective

import "golang.org/x/sys/cpu"

// The assembly kernels of half_amd64.s run where the CPU has AVX2 and F16C;
// each wrapper returns how many leading elements it did (a multiple of 8, or
// 0 on a CPU without them) and leaves the rest to the Go code. Both paths
// round correctly, so they give the same bits and ranks on different CPUs
// still agree.

func halfAsm() bool { return cpu.X86.HasAVX2 && cpu.X86.HasF16C }

//go:noescape
func cvtF32ToF16(dst *uint16, src *float32, n int)

//go:noescape
func cvtF16ToF32(dst *float32, src *uint16, n int, div float32)

//go:noescape
func cvtF32ToBF16(dst *uint16, src *float32, n int)

//go:noescape
func cvtBF16ToF32(dst *float32, src *uint16, n int, div float32)

//go:noescape
func sumF16(dst, src *uint16, n int)

//go:noescape
func sumBF16(dst, src *uint16, n int)

//go:noescape
func feedbackF16(dst *uint16, src, res *float32, n int)

//go:noescape
func feedbackBF16(dst *uint16, src, res *float32, n int)

func f32ToF16Asm(dst []uint16, src []float32) int {
	n := len(src) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	cvtF32ToF16(&dst[:n][0], &src[0], n)
	return n
}

// f16ToF32Asm widens, then divides by div unless div is 0.
func f16ToF32Asm(dst []float32, src []uint16, div float32) int {
	n := len(src) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	cvtF16ToF32(&dst[:n][0], &src[0], n, div)
	return n
}

func f32ToBF16Asm(dst []uint16, src []float32) int {
	n := len(src) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	cvtF32ToBF16(&dst[:n][0], &src[0], n)
	return n
}

// bf16ToF32Asm widens, then divides by div unless div is 0.
func bf16ToF32Asm(dst []float32, src []uint16, div float32) int {
	n := len(src) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	cvtBF16ToF32(&dst[:n][0], &src[0], n, div)
	return n
}

func sumF16Asm(dst, src []uint16) int {
	n := len(dst) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	sumF16(&dst[0], &src[:n][0], n)
	return n
}

func sumBF16Asm(dst, src []uint16) int {
	n := len(dst) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	sumBF16(&dst[0], &src[:n][0], n)
	return n
}

func feedbackF16Asm(dst []uint16, src, res []float32) int {
	n := len(src) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	feedbackF16(&dst[:n][0], &src[0], &res[:n][0], n)
	return n
}

func feedbackBF16Asm(dst []uint16, src, res []float32) int {
	n := len(src) &^ 7
	if n == 0 || !halfAsm() {
		return 0
	}
	feedbackBF16(&dst[:n][0], &src[0], &res[:n][0], n)
	return n
}
