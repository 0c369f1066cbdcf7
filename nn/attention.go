package nn

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// CausalAttention is the core of causal multi-head self-attention: its
// input rows are sequences of Seq consecutive rows, each row a token's
// query, key and value side by side (3·Width columns: Q, then K, then V,
// each Heads heads of Width/Heads), and its output row i is, head by head,
// the softmax-weighted sum of the values of tokens 0..i of its sequence,
// weighted by exp(q_i·k_j / √(Width/Heads)). The projections in and out
// are Dense layers around it, so that a tensor-parallel block can split
// them by heads. It is Slotted.
type CausalAttention struct {
	Heads, Width, Seq int
	slots             []attnCache
	slot              int
}

type attnCache struct {
	x     []float32 // the caller's input, until the backward
	p     []float32 // per sequence and head, the Seq × Seq attention weights (causal: row i uses 0..i)
	y, dx []float32
	ds    []float32 // the backward's T × T scratch: dP, then dS
}

// NewCausalAttention is the core for heads heads over width features and
// sequences of seq tokens; heads must divide width.
func NewCausalAttention(heads, width, seq int) (*CausalAttention, error) {
	if heads < 1 || width < 1 || seq < 1 || width%heads != 0 {
		return nil, fmt.Errorf("nn: attention of %d heads over %d features (sequences of %d): the heads must divide the width", heads, width, seq)
	}
	return &CausalAttention{Heads: heads, Width: width, Seq: seq}, nil
}

func (a *CausalAttention) Params() []*Param { return nil }

// UseSlot makes the following calls use cache slot i (see Slotted).
func (a *CausalAttention) UseSlot(i int) { useSlot(&a.slots, &a.slot, i) }

// ActivationBytes is the size of the buffers of every slot allocated so far.
func (a *CausalAttention) ActivationBytes() int64 {
	var n int
	for _, c := range a.slots {
		n += cap(c.p) + cap(c.y) + cap(c.dx) + cap(c.ds)
	}
	return 4 * int64(n)
}

// view is the rows × cols block of data at offset off with row stride
// stride: one head's queries, keys or values of one sequence.
func view(data []float32, off, rows, cols, stride int) blas32.General {
	return blas32.General{Rows: rows, Cols: cols, Stride: stride, Data: data[off : off+(rows-1)*stride+cols]}
}

// Forward computes, for each sequence and head, the scores Q·Kᵀ/√dh on
// the BLAS (the whole square; the causal mask then drops its upper
// triangle), their row softmax, and the weighted values P·V on the BLAS.
func (a *CausalAttention) Forward(x Matrix) Matrix {
	d, h, T := a.Width, a.Heads, a.Seq
	if x.Cols != 3*d || x.Rows%T != 0 {
		panic(fmt.Sprintf("nn: attention over %d features takes rows of %d (Q, K, V) in sequences of %d, got %d × %d", d, 3*d, T, x.Rows, x.Cols))
	}
	c := slotOf(&a.slots, a.slot)
	c.x = x.Data
	seqs, dh := x.Rows/T, d/h
	scale := float32(1 / math.Sqrt(float64(dh)))
	y := resize(&c.y, x.Rows, d)
	p := resize(&c.p, seqs*h*T, T).Data
	for s := range seqs {
		for hd := range h {
			P := p[(s*h+hd)*T*T : (s*h+hd+1)*T*T]
			at := s*T*3*d + hd*dh
			q, k, v := view(x.Data, at, T, dh, 3*d), view(x.Data, at+d, T, dh, 3*d), view(x.Data, at+2*d, T, dh, 3*d)
			pm := blas32.General{Rows: T, Cols: T, Stride: T, Data: P}
			gemm(blas.NoTrans, blas.Trans, scale, q, k, 0, pm)
			for i := range T {
				row := P[i*T : (i+1)*T]
				m := row[0]
				for _, v := range row[1 : i+1] {
					m = max(m, v)
				}
				var total float64
				for j, v := range row[:i+1] {
					e := Exp32(v - m)
					row[j] = e
					total += float64(e)
				}
				inv := float32(1 / total)
				for j := range row[:i+1] {
					row[j] *= inv
				}
				clear(row[i+1:])
			}
			gemm(blas.NoTrans, blas.NoTrans, 1, pm, v, 0, view(y.Data, s*T*d+hd*dh, T, dh, d))
		}
	}
	return y
}

// Backward, per sequence and head: dP = dO·Vᵀ and dV = Pᵀ·dO on the
// BLAS; dS = P ⊙ (dP − rowsum(P ⊙ dP)) on the causal triangle, scaled by
// 1/√dh; then dQ = dS·K and dK = dSᵀ·Q on the BLAS.
func (a *CausalAttention) Backward(dy Matrix) Matrix {
	d, h, T := a.Width, a.Heads, a.Seq
	c := slotOf(&a.slots, a.slot)
	seqs, dh := dy.Rows/T, d/h
	scale := 1 / math.Sqrt(float64(dh))
	dx := resize(&c.dx, dy.Rows, 3*d)
	x := c.x
	ds := resize(&c.ds, T, T)
	dsm := blas32.General{Rows: T, Cols: T, Stride: T, Data: ds.Data}
	for s := range seqs {
		for hd := range h {
			P := c.p[(s*h+hd)*T*T : (s*h+hd+1)*T*T]
			pm := blas32.General{Rows: T, Cols: T, Stride: T, Data: P}
			at := s*T*3*d + hd*dh
			q, k, v := view(x, at, T, dh, 3*d), view(x, at+d, T, dh, 3*d), view(x, at+2*d, T, dh, 3*d)
			dq, dk, dv := view(dx.Data, at, T, dh, 3*d), view(dx.Data, at+d, T, dh, 3*d), view(dx.Data, at+2*d, T, dh, 3*d)
			do := view(dy.Data, s*T*d+hd*dh, T, dh, d)
			gemm(blas.NoTrans, blas.Trans, 1, do, v, 0, dsm) // dP
			gemm(blas.Trans, blas.NoTrans, 1, pm, do, 0, dv)
			for i := range T {
				row, g := P[i*T:(i+1)*T], ds.Data[i*T:(i+1)*T]
				var dot float64
				for j, p := range row[:i+1] {
					dot += float64(p) * float64(g[j])
				}
				for j, p := range row[:i+1] {
					g[j] = float32(float64(p) * (float64(g[j]) - dot) * scale)
				}
				clear(g[i+1:])
			}
			gemm(blas.NoTrans, blas.NoTrans, 1, dsm, k, 0, dq)
			gemm(blas.Trans, blas.NoTrans, 1, dsm, q, 0, dk)
		}
	}
	return dx
}
