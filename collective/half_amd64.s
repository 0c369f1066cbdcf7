//go:build amd64 && !purego

#include "textflag.h"

// AVX2 and F16C versions of the 16-bit wire kernels of half.go, reduce.go and
// compress.go, eight elements per iteration. n is a multiple of 8 (the Go
// callers do the tail). VCVTPS2PH with immediate 0 rounds to nearest even
// whatever MXCSR says; it keeps a NaN's sign and payload top and sets the
// quiet bit, exactly as f32ToF16Bits does, so both paths give the same bits.
//
// Registers holding constants: Y14 0x00000001, Y13 0x00007fff,
// Y12 0x7fffffff, Y11 0x7f800000, Y10 0x00000040, Y9 0x7fc00000 (canonical
// NaN), Y8 zero. X15 is left alone: Go code expects it zero.

#define CONST(v, x, y) \
	MOVL $v, AX; \
	MOVQ AX, x; \
	VPBROADCASTD x, y

// BF16ROUND rounds the float32 lanes of y (bits) to bfloat16, leaving each
// result in the low half of its 32-bit lane: (b + 0x7fff + (b>>16 & 1)) >> 16,
// or b>>16 | 0x40 for a NaN. Clobbers Y4-Y7.
#define BF16ROUND(y) \
	VPSRLD $16, y, Y4; \
	VPAND Y14, Y4, Y5; \
	VPADDD Y13, y, Y6; \
	VPADDD Y5, Y6, Y6; \
	VPSRLD $16, Y6, Y6; \
	VPAND Y12, y, Y7; \
	VPCMPGTD Y11, Y7, Y7; \
	VPOR Y10, Y4, Y4; \
	VPBLENDVB Y7, Y4, Y6, y

// PACK16 packs the low halves of y's eight 32-bit lanes, in order, into x.
// Clobbers X5.
#define PACK16(y, x) \
	VEXTRACTI128 $1, y, X5; \
	VPACKUSDW X5, x, x

// func hasHalfAsm() bool is in half_amd64.go.

// func cvtF32ToF16(dst *uint16, src *float32, n int)
TEXT ·cvtF32ToF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   f2h_done
f2h_loop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU   X1, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       f2h_loop
f2h_done:
	VZEROUPPER
	RET

// func cvtF16ToF32(dst *float32, src *uint16, n int, div float32)
// div == 0 means no division.
TEXT ·cvtF16ToF32(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS div+24(FP), Y3
	SHRQ $3, CX
	JZ   h2f_done
	VXORPS Y8, Y8, Y8
	VUCOMISS X8, X3
	JNE  h2f_div
h2f_loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       h2f_loop
	JMP       h2f_done
h2f_div:
	VCVTPH2PS (SI), Y0
	VDIVPS    Y3, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       h2f_div
h2f_done:
	VZEROUPPER
	RET

// func cvtF32ToBF16(dst *uint16, src *float32, n int)
TEXT ·cvtF32ToBF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   f2b_done
	CONST(0x00000001, X14, Y14)
	CONST(0x00007fff, X13, Y13)
	CONST(0x7fffffff, X12, Y12)
	CONST(0x7f800000, X11, Y11)
	CONST(0x00000040, X10, Y10)
f2b_loop:
	VMOVDQU (SI), Y0
	BF16ROUND(Y0)
	PACK16(Y0, X0)
	VMOVDQU X0, (DI)
	ADDQ    $32, SI
	ADDQ    $16, DI
	DECQ    CX
	JNZ     f2b_loop
f2b_done:
	VZEROUPPER
	RET

// func cvtBF16ToF32(dst *float32, src *uint16, n int, div float32)
// div == 0 means no division.
TEXT ·cvtBF16ToF32(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS div+24(FP), Y3
	SHRQ $3, CX
	JZ   b2f_done
	VXORPS Y8, Y8, Y8
	VUCOMISS X8, X3
	JNE  b2f_div
b2f_loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       b2f_loop
	JMP       b2f_done
b2f_div:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VDIVPS    Y3, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       b2f_div
b2f_done:
	VZEROUPPER
	RET

// func sumF16(dst, src *uint16, n int)
// dst[i] = half(float(dst[i]) + float(src[i])), a NaN stored canonical.
TEXT ·sumF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   sh_done
	CONST(0x7fc00000, X9, Y9)
sh_loop:
	VCVTPH2PS (DI), Y0
	VCVTPH2PS (SI), Y1
	VADDPS    Y1, Y0, Y0
	VCMPPS    $3, Y0, Y0, Y2 // unordered: NaN lanes
	VBLENDVPS Y2, Y9, Y0, Y0
	VCVTPS2PH $0, Y0, X0
	VMOVDQU   X0, (DI)
	ADDQ      $16, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       sh_loop
sh_done:
	VZEROUPPER
	RET

// func sumBF16(dst, src *uint16, n int)
TEXT ·sumBF16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   sb_done
	CONST(0x00000001, X14, Y14)
	CONST(0x00007fff, X13, Y13)
	CONST(0x7fffffff, X12, Y12)
	CONST(0x7f800000, X11, Y11)
	CONST(0x00000040, X10, Y10)
	CONST(0x7fc00000, X9, Y9)
sb_loop:
	VPMOVZXWD (DI), Y0
	VPSLLD    $16, Y0, Y0
	VPMOVZXWD (SI), Y1
	VPSLLD    $16, Y1, Y1
	VADDPS    Y1, Y0, Y0
	VCMPPS    $3, Y0, Y0, Y2
	VBLENDVPS Y2, Y9, Y0, Y0
	BF16ROUND(Y0)
	PACK16(Y0, X0)
	VMOVDQU   X0, (DI)
	ADDQ      $16, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       sb_loop
sb_done:
	VZEROUPPER
	RET

// func feedbackF16(dst *uint16, src, res *float32, n int)
// v = src+res; dst = half(v); res = v − float(dst), or 0 if not finite.
TEXT ·feedbackF16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JZ   fh_done
	VXORPS Y8, Y8, Y8
fh_loop:
	VMOVUPS   (SI), Y0
	VADDPS    (DX), Y0, Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU   X1, (DI)
	VCVTPH2PS X1, Y1
	VSUBPS    Y1, Y0, Y0 // residue
	VSUBPS    Y0, Y0, Y2 // 0 when finite, NaN otherwise
	VCMPPS    $0, Y8, Y2, Y2 // equal to zero (ordered)
	VANDPS    Y2, Y0, Y0
	VMOVUPS   Y0, (DX)
	ADDQ      $32, SI
	ADDQ      $32, DX
	ADDQ      $16, DI
	DECQ      CX
	JNZ       fh_loop
fh_done:
	VZEROUPPER
	RET

// func feedbackBF16(dst *uint16, src, res *float32, n int)
TEXT ·feedbackBF16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ res+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JZ   fb_done
	CONST(0x00000001, X14, Y14)
	CONST(0x00007fff, X13, Y13)
	CONST(0x7fffffff, X12, Y12)
	CONST(0x7f800000, X11, Y11)
	CONST(0x00000040, X10, Y10)
	VXORPS Y8, Y8, Y8
fb_loop:
	VMOVUPS   (SI), Y0
	VADDPS    (DX), Y0, Y0
	VMOVAPS   Y0, Y3
	BF16ROUND(Y0)
	VPSLLD    $16, Y0, Y1 // the rounded value, widened
	PACK16(Y0, X0)
	VMOVDQU   X0, (DI)
	VSUBPS    Y1, Y3, Y3
	VSUBPS    Y3, Y3, Y2
	VCMPPS    $0, Y8, Y2, Y2
	VANDPS    Y2, Y3, Y3
	VMOVUPS   Y3, (DX)
	ADDQ      $32, SI
	ADDQ      $32, DX
	ADDQ      $16, DI
	DECQ      CX
	JNZ       fb_loop
fb_done:
	VZEROUPPER
	RET
