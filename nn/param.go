package nn

import "fmt"

// Param is a named parameter tensor and its gradient, laid out row-major.
type Param struct {
	Name  string
	Shape []int
	Value []float32
	Grad  []float32
}

// NewParam allocates a zeroed parameter of the given shape.
func NewParam(name string, shape ...int) *Param {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return &Param{Name: name, Shape: shape, Value: make([]float32, n), Grad: make([]float32, n)}
}

// Size is the number of elements.
func (p *Param) Size() int { return len(p.Value) }

func (p *Param) String() string { return fmt.Sprintf("%s%v", p.Name, p.Shape) }

// ZeroGrads clears the gradients of ps.
func ZeroGrads(ps []*Param) {
	for _, p := range ps {
		clear(p.Grad)
	}
}

// Matrix is a row-major batch of rows, a view over Data.
type Matrix struct {
	Rows, Cols int
	Data       []float32
}

// Row is row i.
func (m Matrix) Row(i int) []float32 { return m.Data[i*m.Cols : (i+1)*m.Cols] }

// resize returns a rows×cols matrix backed by *buf, growing it when needed, so
// a layer's output buffer is allocated once for the largest batch.
func resize(buf *[]float32, rows, cols int) Matrix {
	n := rows * cols
	if cap(*buf) < n {
		*buf = make([]float32, n)
	}
	return Matrix{Rows: rows, Cols: cols, Data: (*buf)[:n]}
}
