package main

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
)

// convNet is a small convolutional classifier written from scratch against
// the worker interfaces: a 3×3 convolution with filters channels, ReLU,
// 2×2 max pooling and a dense layer to the classes, trained with softmax
// cross-entropy. Images are side×side, one channel.
type convNet struct {
	side, filters, classes int
	kernel, kbias          *nn.Param // filters×3×3, filters
	dense, dbias           *nn.Param // classes×pooled, classes
	// per-sample scratch, reused
	conv   []float32 // filters×cs×cs after ReLU
	pooled []float32 // filters×ps×ps
	argmax []int32   // the conv index each pooled value came from
	logits []float64
	dpool  []float32
}

func newConvNet(side, filters, classes int, seed uint64) (*convNet, error) {
	if side < 4 || filters < 1 || classes < 2 {
		return nil, fmt.Errorf("conv: side %d, filters %d, classes %d: want side >= 4, filters >= 1, classes >= 2", side, filters, classes)
	}
	cs := side - 2
	ps := cs / 2
	m := &convNet{side: side, filters: filters, classes: classes,
		kernel: nn.NewParam("conv.kernel", filters, 3, 3), kbias: nn.NewParam("conv.bias", filters),
		dense: nn.NewParam("dense.weight", classes, filters*ps*ps), dbias: nn.NewParam("dense.bias", classes),
		conv: make([]float32, filters*cs*cs), pooled: make([]float32, filters*ps*ps), argmax: make([]int32, filters*ps*ps),
		logits: make([]float64, classes), dpool: make([]float32, filters*ps*ps)}
	rng := rand.New(rand.NewPCG(seed, 0xc0de))
	for i := range m.kernel.Value {
		m.kernel.Value[i] = float32(rng.NormFloat64() * math.Sqrt(2.0/9))
	}
	for i := range m.dense.Value {
		m.dense.Value[i] = float32(rng.NormFloat64() * math.Sqrt(1.0/float64(filters*ps*ps)))
	}
	return m, nil
}

// Params implements worker.Model.
func (m *convNet) Params() []*nn.Param { return []*nn.Param{m.kernel, m.kbias, m.dense, m.dbias} }

// forward computes one image's logits, keeping what backward needs.
func (m *convNet) forward(x []float32) {
	s, cs, ps := m.side, m.side-2, (m.side-2)/2
	k := m.kernel.Value
	for f := range m.filters {
		for i := range cs {
			for j := range cs {
				v := m.kbias.Value[f]
				for a := range 3 {
					row := x[(i+a)*s+j:]
					kr := k[f*9+a*3:]
					v += row[0]*kr[0] + row[1]*kr[1] + row[2]*kr[2]
				}
				m.conv[(f*cs+i)*cs+j] = max(v, 0)
			}
		}
		for i := range ps {
			for j := range ps {
				best, at := float32(-1), int32(0)
				for a := range 2 {
					for b := range 2 {
						idx := int32((f*cs+2*i+a)*cs + 2*j + b)
						if v := m.conv[idx]; v > best {
							best, at = v, idx
						}
					}
				}
				p := (f*ps+i)*ps + j
				m.pooled[p], m.argmax[p] = best, at
			}
		}
	}
	n := len(m.pooled)
	for c := range m.classes {
		v := float64(m.dbias.Value[c])
		w := m.dense.Value[c*n : (c+1)*n]
		for i, p := range m.pooled {
			v += float64(w[i] * p)
		}
		m.logits[c] = v
	}
}

// softmax turns the logits into probabilities in place and returns the
// loss of label and whether the arg max is label.
func (m *convNet) softmax(label int32) (loss float64, correct bool) {
	top := 0
	mx := m.logits[0]
	for c, v := range m.logits {
		if v > mx {
			mx, top = v, c
		}
	}
	var sum float64
	for c, v := range m.logits {
		m.logits[c] = math.Exp(v - mx)
		sum += m.logits[c]
	}
	for c := range m.logits {
		m.logits[c] /= sum
	}
	return -math.Log(max(m.logits[label], 1e-12)), top == int(label)
}

func (m *convNet) check(b *worker.Batch) error {
	if b.Features != m.side*m.side || len(b.X) != b.N*b.Features || len(b.Labels) != b.N {
		return fmt.Errorf("conv: a batch of %d samples × %d features; the model takes %d×%d images", b.N, b.Features, m.side, m.side)
	}
	for _, l := range b.Labels {
		if l < 0 || int(l) >= m.classes {
			return fmt.Errorf("conv: label %d outside 0..%d", l, m.classes-1)
		}
	}
	return nil
}

// Step implements worker.Model: forward, loss and backward of each image,
// adding scale × the gradients.
func (m *convNet) Step(b *worker.Batch, scale float32, _ func(int)) (worker.Result, error) {
	if err := m.check(b); err != nil {
		return worker.Result{}, err
	}
	var res worker.Result
	s, cs, n := m.side, m.side-2, len(m.pooled)
	for i := range b.N {
		x := b.X[i*b.Features : (i+1)*b.Features]
		m.forward(x)
		loss, ok := m.softmax(b.Labels[i])
		res.LossSum += loss
		if ok {
			res.Correct++
		}
		clear(m.dpool)
		for c := range m.classes {
			g := m.logits[c]
			if c == int(b.Labels[i]) {
				g--
			}
			gs := float32(g) * scale
			m.dbias.Grad[c] += gs
			w, dw := m.dense.Value[c*n:(c+1)*n], m.dense.Grad[c*n:(c+1)*n]
			for j, p := range m.pooled {
				dw[j] += gs * p
				m.dpool[j] += gs * w[j]
			}
		}
		for p, g := range m.dpool { // through the pooling and the ReLU into the kernel
			at := int(m.argmax[p])
			if m.conv[at] <= 0 {
				continue
			}
			f := at / (cs * cs)
			oi, oj := (at%(cs*cs))/cs, at%cs
			m.kbias.Grad[f] += g
			for a := range 3 {
				row := x[(oi+a)*s+oj:]
				kg := m.kernel.Grad[f*9+a*3:]
				kg[0] += g * row[0]
				kg[1] += g * row[1]
				kg[2] += g * row[2]
			}
		}
	}
	return res, nil
}

// Evaluate implements worker.Evaluator.
func (m *convNet) Evaluate(b *worker.Batch) (worker.Result, error) {
	if err := m.check(b); err != nil {
		return worker.Result{}, err
	}
	var res worker.Result
	for i := range b.N {
		m.forward(b.X[i*b.Features : (i+1)*b.Features])
		loss, ok := m.softmax(b.Labels[i])
		res.LossSum += loss
		if ok {
			res.Correct++
		}
	}
	return res, nil
}
