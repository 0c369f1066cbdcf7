//go:build amd64 && !purego

#include "textflag.h"

// AVX2 element-wise sums for reduce.go: dst[i] += src[i], 32 float32 or 16
// float64 elements per iteration; n is a multiple of that (the Go callers do
// the tail). VADDPS/VADDPD round each lane exactly as the scalar ADDSS/ADDSD
// of the Go loop, so both paths give the same bits, but for the payload of a
// sum of two NaNs (x86 keeps the first operand's; dst is first here, and the
// Go compiler picks its own order).

// func sumF32(dst, src *float32, n int)
TEXT ·sumF32(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $5, CX
	JZ   s32_done
s32_loop:
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VADDPS  (SI), Y0, Y0
	VADDPS  32(SI), Y1, Y1
	VADDPS  64(SI), Y2, Y2
	VADDPS  96(SI), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DI
	DECQ    CX
	JNZ     s32_loop
s32_done:
	VZEROUPPER
	RET

// func sumF64(dst, src *float64, n int)
TEXT ·sumF64(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   s64_done
s64_loop:
	VMOVUPD (DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	VADDPD  (SI), Y0, Y0
	VADDPD  32(SI), Y1, Y1
	VADDPD  64(SI), Y2, Y2
	VADDPD  96(SI), Y3, Y3
	VMOVUPD Y0, (DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DI
	DECQ    CX
	JNZ     s64_loop
s64_done:
	VZEROUPPER
	RET
