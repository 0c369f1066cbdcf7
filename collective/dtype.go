package collective

import (
	"fmt"
	"unsafe"
)

// DType is the element type of a Buffer.
type DType uint8

// Element types carried by the data plane.
const (
	Uint8 DType = iota + 1
	Float32
	Float64
	// Float16 is IEEE 754 binary16 (1 sign, 5 exponent, 10 mantissa bits),
	// carried as its uint16 bit pattern. It is a wire type for compressed
	// gradients: reductions convert both operands to float32, combine them
	// there and round the result back to nearest even.
	Float16
	// BFloat16 is the upper half of a float32 (1 sign, 8 exponent, 7 mantissa
	// bits), carried as its uint16 bit pattern and reduced like Float16.
	BFloat16
)

// Size is the element size in bytes.
func (d DType) Size() int {
	switch d {
	case Uint8:
		return 1
	case Float32:
		return 4
	case Float64:
		return 8
	case Float16, BFloat16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case Uint8:
		return "uint8"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

func (d DType) valid() bool { return d >= Uint8 && d <= BFloat16 }

// Reducible says whether buffers of d can be reduced (every type but Uint8).
func (d DType) Reducible() bool { return d >= Float32 && d <= BFloat16 }

// Half says whether d is one of the 16-bit wire types, Float16 or BFloat16.
func (d DType) Half() bool { return d == Float16 || d == BFloat16 }

// ParseDType maps "float32", "float64", "float16" (or "fp16") and "bfloat16"
// (or "bf16") to its DType.
func ParseDType(s string) (DType, error) {
	switch s {
	case "float32", "fp32":
		return Float32, nil
	case "float64", "fp64":
		return Float64, nil
	case "float16", "fp16":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	}
	return 0, fmt.Errorf("collective: unknown dtype %q (want float32, float64, fp16 or bf16)", s)
}

// ReduceOp combines elements of the same index across ranks.
type ReduceOp uint8

// Reductions. Avg is the sum divided by the number of ranks.
const (
	Sum ReduceOp = iota + 1
	Avg
	Min
	Max
)

func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Avg:
		return "avg"
	case Min:
		return "min"
	case Max:
		return "max"
	}
	return fmt.Sprintf("reduceop(%d)", uint8(o))
}

// ParseReduceOp maps "sum", "avg", "min" or "max" to its ReduceOp.
func ParseReduceOp(s string) (ReduceOp, error) {
	for _, o := range []ReduceOp{Sum, Avg, Min, Max} {
		if o.String() == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("collective: unknown reduce op %q (want sum, avg, min or max)", s)
}

// Float is the element constraint of the typed helpers.
type Float interface{ ~float32 | ~float64 }

// Buffer is a typed view of caller memory taking part in a collective. It
// aliases the slice it was made from: no copy is made.
type Buffer struct {
	b  []byte
	dt DType
}

// Float32s views x as a Buffer.
func Float32s(x []float32) Buffer { return Buffer{b: bytesOf(x), dt: Float32} }

// Float64s views x as a Buffer.
func Float64s(x []float64) Buffer { return Buffer{b: bytesOf(x), dt: Float64} }

// Float16s views x, IEEE binary16 bit patterns, as a Buffer of Float16.
func Float16s(x []uint16) Buffer { return Buffer{b: bytesOf(x), dt: Float16} }

// BFloat16s views x, bfloat16 bit patterns, as a Buffer of BFloat16.
func BFloat16s(x []uint16) Buffer { return Buffer{b: bytesOf(x), dt: BFloat16} }

// Bytes views x as a Buffer of Uint8; it cannot be reduced.
func Bytes(x []byte) Buffer { return Buffer{b: x, dt: Uint8} }

// Of views a slice of either float type as a Buffer.
func Of[T Float](x []T) Buffer {
	var z T
	if unsafe.Sizeof(z) == 4 {
		return Buffer{b: bytesOf(x), dt: Float32}
	}
	return Buffer{b: bytesOf(x), dt: Float64}
}

// Len is the number of elements.
func (b Buffer) Len() int {
	if b.dt == 0 {
		return 0
	}
	return len(b.b) / b.dt.Size()
}

// DType is the element type.
func (b Buffer) DType() DType { return b.dt }

// Raw returns the buffer's bytes.
func (b Buffer) Raw() []byte { return b.b }

func bytesOf[T any](x []T) []byte {
	if len(x) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*int(unsafe.Sizeof(z)))
}

func f32s(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

func u16s(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
}

func f64s(b []byte) []float64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}
