package nn

import (
	"fmt"
	"math"
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
	dp    []float64 // the backward's per-row scratch
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
		n += cap(c.p) + cap(c.y) + cap(c.dx)
	}
	return 4 * int64(n)
}

func (a *CausalAttention) Forward(x Matrix) Matrix {
	d, h, T := a.Width, a.Heads, a.Seq
	if x.Cols != 3*d || x.Rows%T != 0 {
		panic(fmt.Sprintf("nn: attention over %d features takes rows of %d (Q, K, V) in sequences of %d, got %d × %d", d, 3*d, T, x.Rows, x.Cols))
	}
	c := slotOf(&a.slots, a.slot)
	c.x = x.Data
	seqs, dh := x.Rows/T, d/h
	scale := 1 / math.Sqrt(float64(dh))
	y := resize(&c.y, x.Rows, d)
	p := resize(&c.p, seqs*h*T, T).Data
	for s := range seqs {
		for hd := range h {
			P := p[(s*h+hd)*T*T : (s*h+hd+1)*T*T]
			for i := range T {
				qi := x.Data[(s*T+i)*3*d+hd*dh : (s*T+i)*3*d+(hd+1)*dh]
				row := P[i*T : (i+1)*T]
				m := math.Inf(-1)
				for j := 0; j <= i; j++ {
					kj := x.Data[(s*T+j)*3*d+d+hd*dh : (s*T+j)*3*d+d+(hd+1)*dh]
					var dot float64
					for e, q := range qi {
						dot += float64(q) * float64(kj[e])
					}
					row[j] = float32(dot * scale)
					m = max(m, dot*scale)
				}
				var total float64
				for j := 0; j <= i; j++ {
					e := math.Exp(float64(row[j]) - m)
					row[j] = float32(e)
					total += e
				}
				for j := 0; j <= i; j++ {
					row[j] = float32(float64(row[j]) / total)
				}
				clear(row[i+1:])
				out := y.Data[(s*T+i)*d+hd*dh : (s*T+i)*d+(hd+1)*dh]
				clear(out)
				for j := 0; j <= i; j++ {
					vj := x.Data[(s*T+j)*3*d+2*d+hd*dh : (s*T+j)*3*d+2*d+(hd+1)*dh]
					w := row[j]
					for e, v := range vj {
						out[e] += w * v
					}
				}
			}
		}
	}
	return y
}

func (a *CausalAttention) Backward(dy Matrix) Matrix {
	d, h, T := a.Width, a.Heads, a.Seq
	c := slotOf(&a.slots, a.slot)
	seqs, dh := dy.Rows/T, d/h
	scale := 1 / math.Sqrt(float64(dh))
	dx := resize(&c.dx, dy.Rows, 3*d)
	clear(dx.Data)
	x := c.x
	if cap(c.dp) < T {
		c.dp = make([]float64, T)
	}
	dp := c.dp[:T]
	for s := range seqs {
		for hd := range h {
			P := c.p[(s*h+hd)*T*T : (s*h+hd+1)*T*T]
			for i := range T {
				doi := dy.Data[(s*T+i)*d+hd*dh : (s*T+i)*d+(hd+1)*dh]
				row := P[i*T : (i+1)*T]
				// dP_ij = dO_i · v_j; dV_j += P_ij dO_i
				var dot float64
				for j := 0; j <= i; j++ {
					vj := x[(s*T+j)*3*d+2*d+hd*dh : (s*T+j)*3*d+2*d+(hd+1)*dh]
					dvj := dx.Data[(s*T+j)*3*d+2*d+hd*dh : (s*T+j)*3*d+2*d+(hd+1)*dh]
					var g float64
					for e, o := range doi {
						g += float64(o) * float64(vj[e])
						dvj[e] += row[j] * o
					}
					dp[j] = g
					dot += float64(row[j]) * g
				}
				// dS_ij = P_ij (dP_ij − Σ_k P_ik dP_ik); dQ_i += scale dS_ij k_j; dK_j += scale dS_ij q_i
				qi := x[(s*T+i)*3*d+hd*dh : (s*T+i)*3*d+(hd+1)*dh]
				dqi := dx.Data[(s*T+i)*3*d+hd*dh : (s*T+i)*3*d+(hd+1)*dh]
				for j := 0; j <= i; j++ {
					ds := float32(float64(row[j]) * (dp[j] - dot) * scale)
					kj := x[(s*T+j)*3*d+d+hd*dh : (s*T+j)*3*d+d+(hd+1)*dh]
					dkj := dx.Data[(s*T+j)*3*d+d+hd*dh : (s*T+j)*3*d+d+(hd+1)*dh]
					for e := range dh {
						dqi[e] += ds * kj[e]
						dkj[e] += ds * qi[e]
					}
				}
			}
		}
	}
	return dx
}
