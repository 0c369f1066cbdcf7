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
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

func (d DType) valid() bool { return d >= Uint8 && d <= Float64 }

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

func f64s(b []byte) []float64 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}
