//go:build !amd64 || purego

package collective

// Without the assembly kernels every element goes through the Go code.

func halfAsm() bool { return false }

func f32ToF16Asm([]uint16, []float32) int                { return 0 }
func f16ToF32Asm([]float32, []uint16, float32) int       { return 0 }
func f32ToBF16Asm([]uint16, []float32) int               { return 0 }
func bf16ToF32Asm([]float32, []uint16, float32) int      { return 0 }
func sumF16Asm(_, _ []uint16) int                        { return 0 }
func sumBF16Asm(_, _ []uint16) int                       { return 0 }
func feedbackF16Asm([]uint16, []float32, []float32) int  { return 0 }
func feedbackBF16Asm([]uint16, []float32, []float32) int { return 0 }
