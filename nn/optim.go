package nn

import (
	"fmt"
	"math"
	"strings"
)

// Tensor is a named slice of optimizer state.
type Tensor struct {
	Name  string
	Shape []int // the shape of the parameter it belongs to
	Data  []float32
}

// Optimizer updates parameters from their gradients. Its per-parameter state
// (momentum, Adam moments) is exposed as Slots so it is committed, restored,
// synchronised and checkpointed with the parameters.
type Optimizer interface {
	// Update applies one step with learning rate lr; step counts updates from 1.
	Update(params []*Param, lr float32, step int64)
	Slots() []Tensor
}

// SavingOptimizer is an Optimizer that copies what an update changes aside
// in the update's own pass over memory: UpdateSaving is Update, but first,
// block by block as each is loaded, it copies the parameters' values into
// saved[k] (k the parameter's index) and its slots into
// saved[len(params)+j] (j the slot's index in Slots). The trainer's
// in-memory commit of the step's start is taken so, without a pass of its
// own over the parameters and slots, which do not fit in a core's cache,
// when it commits less often than every step; committing every step, it
// keeps no copy at all (see worker.Trainer). Neither Update nor
// UpdateSaving may fail part-way. Every optimizer of NewOptimizer is one.
type SavingOptimizer interface {
	Optimizer
	UpdateSaving(params []*Param, lr float32, step int64, saved [][]float32)
}

// saveBlock is how many elements of each tensor UpdateSaving copies before it
// updates them: four tensors of this many float32s fit in a core's L1 cache.
const saveBlock = 2048

// blocks calls f over [0, n) in saveBlock-sized ranges, after saving each
// range of every pair: dst[i][lo:hi] = src[i][lo:hi].
func blocks(n int, dst, src [][]float32, f func(lo, hi int)) {
	for lo := 0; lo < n; lo += saveBlock {
		hi := min(lo+saveBlock, n)
		for i, d := range dst {
			copy(d[lo:hi], src[i][lo:hi])
		}
		f(lo, hi)
	}
}

// OptimizerConfig selects and tunes an optimizer.
type OptimizerConfig struct {
	Kind        string  // sgd, momentum, adam or adamw
	Momentum    float64 // momentum: default 0.9
	Nesterov    bool
	Beta1       float64 // adam: default 0.9
	Beta2       float64 // adam: default 0.999
	Eps         float64 // adam: default 1e-8
	WeightDecay float64 // L2 for sgd, momentum and adam; decoupled for adamw
}

// NewOptimizer builds the optimizer of cfg for params.
func NewOptimizer(cfg OptimizerConfig, params []*Param) (Optimizer, error) {
	switch strings.ToLower(cfg.Kind) {
	case "", "sgd":
		return &SGD{WeightDecay: float32(cfg.WeightDecay)}, nil
	case "momentum":
		mu := cfg.Momentum
		if mu == 0 {
			mu = 0.9
		}
		if mu < 0 || mu >= 1 {
			return nil, fmt.Errorf("nn: momentum %v: want [0, 1)", mu)
		}
		return &Momentum{Mu: float32(mu), Nesterov: cfg.Nesterov, WeightDecay: float32(cfg.WeightDecay), buf: slots(params, "momentum")}, nil
	case "adam", "adamw":
		a := &Adam{Beta1: cfg.Beta1, Beta2: cfg.Beta2, Eps: cfg.Eps, WeightDecay: float32(cfg.WeightDecay),
			Decoupled: strings.EqualFold(cfg.Kind, "adamw"), m: slots(params, "adam.m"), v: slots(params, "adam.v")}
		if a.Beta1 == 0 {
			a.Beta1 = 0.9
		}
		if a.Beta2 == 0 {
			a.Beta2 = 0.999
		}
		if a.Eps == 0 {
			a.Eps = 1e-8
		}
		if a.Beta1 < 0 || a.Beta1 >= 1 || a.Beta2 < 0 || a.Beta2 >= 1 {
			return nil, fmt.Errorf("nn: adam betas (%v, %v): want [0, 1)", a.Beta1, a.Beta2)
		}
		return a, nil
	}
	return nil, fmt.Errorf("nn: unknown optimizer %q: want sgd, momentum, adam or adamw", cfg.Kind)
}

func slots(params []*Param, kind string) []Tensor {
	out := make([]Tensor, len(params))
	for i, p := range params {
		out[i] = Tensor{Name: p.Name + "/" + kind, Shape: p.Shape, Data: make([]float32, p.Size())}
	}
	return out
}

// SGD is plain stochastic gradient descent with optional L2 weight decay.
type SGD struct{ WeightDecay float32 }

func (o *SGD) Slots() []Tensor { return nil }

func (o *SGD) Update(params []*Param, lr float32, _ int64) {
	for _, p := range params {
		o.update(p, lr, 0, len(p.Value))
	}
}

// UpdateSaving is Update, saving the values first (see SavingOptimizer).
func (o *SGD) UpdateSaving(params []*Param, lr float32, _ int64, saved [][]float32) {
	for k, p := range params {
		blocks(len(p.Value), saved[k:k+1], [][]float32{p.Value}, func(lo, hi int) { o.update(p, lr, lo, hi) })
	}
}

func (o *SGD) update(p *Param, lr float32, lo, hi int) {
	v := p.Value[lo:hi]
	grad := p.Grad[lo:hi][:len(v)]
	for i, g := range grad {
		v[i] -= lr * (g + o.WeightDecay*v[i])
	}
}

// Momentum is SGD with (optionally Nesterov) momentum.
type Momentum struct {
	Mu          float32
	Nesterov    bool
	WeightDecay float32
	buf         []Tensor
}

func (o *Momentum) Slots() []Tensor { return o.buf }

func (o *Momentum) Update(params []*Param, lr float32, _ int64) {
	for k, p := range params {
		o.update(k, p, lr, 0, len(p.Value))
	}
}

// UpdateSaving is Update, saving the values and the momenta first (see
// SavingOptimizer).
func (o *Momentum) UpdateSaving(params []*Param, lr float32, _ int64, saved [][]float32) {
	n := len(params)
	for k, p := range params {
		blocks(len(p.Value), [][]float32{saved[k], saved[n+k]}, [][]float32{p.Value, o.buf[k].Data},
			func(lo, hi int) { o.update(k, p, lr, lo, hi) })
	}
}

func (o *Momentum) update(k int, p *Param, lr float32, lo, hi int) {
	mu, wd := o.Mu, o.WeightDecay
	b := o.buf[k].Data[lo:hi]
	v, grad := p.Value[lo:hi][:len(b)], p.Grad[lo:hi][:len(b)] // one length: no bounds checks below
	switch {
	case wd == 0 && !o.Nesterov: // the common case, kept branch-free
		for i, g := range grad {
			m := mu*b[i] + g
			b[i] = m
			v[i] -= lr * m
		}
	default:
		for i, g := range grad {
			g += wd * v[i]
			m := mu*b[i] + g
			b[i] = m
			if o.Nesterov {
				g += mu * m
			} else {
				g = m
			}
			v[i] -= lr * g
		}
	}
}

// Adam is Adam, or AdamW when Decoupled (weight decay applied to the weights,
// not through the moments).
type Adam struct {
	Beta1, Beta2, Eps float64
	WeightDecay       float32
	Decoupled         bool
	m, v              []Tensor
}

func (o *Adam) Slots() []Tensor { return append(append([]Tensor(nil), o.m...), o.v...) }

func (o *Adam) Update(params []*Param, lr float32, step int64) {
	for k, p := range params {
		o.update(k, p, lr, step, 0, len(p.Value))
	}
}

// UpdateSaving is Update, saving the values and both moments first (see
// SavingOptimizer; the slots are every m, then every v).
func (o *Adam) UpdateSaving(params []*Param, lr float32, step int64, saved [][]float32) {
	n := len(params)
	for k, p := range params {
		blocks(len(p.Value), [][]float32{saved[k], saved[n+k], saved[2*n+k]}, [][]float32{p.Value, o.m[k].Data, o.v[k].Data},
			func(lo, hi int) { o.update(k, p, lr, step, lo, hi) })
	}
}

func (o *Adam) update(k int, p *Param, lr float32, step int64, lo, hi int) {
	b1, b2 := float32(o.Beta1), float32(o.Beta2)
	c1 := float32(1 - math.Pow(o.Beta1, float64(step)))
	c2 := float32(math.Sqrt(1 - math.Pow(o.Beta2, float64(step))))
	alpha, eps := lr*c2/c1, float32(o.Eps)*c2
	val := p.Value[lo:hi]
	m, v, grad := o.m[k].Data[lo:hi][:len(val)], o.v[k].Data[lo:hi][:len(val)], p.Grad[lo:hi][:len(val)]
	for i, g := range grad {
		if o.Decoupled {
			val[i] -= lr * o.WeightDecay * val[i]
		} else {
			g += o.WeightDecay * val[i]
		}
		m[i] = b1*m[i] + (1-b1)*g
		v[i] = b2*v[i] + (1-b2)*g*g
		val[i] -= alpha * m[i] / (float32(math.Sqrt(float64(v[i]))) + eps)
	}
}

// GlobalNorm is the L2 norm of every gradient of params together.
func GlobalNorm(params []*Param) float64 {
	var s float64
	for _, p := range params {
		for _, g := range p.Grad {
			s += float64(g) * float64(g)
		}
	}
	return math.Sqrt(s)
}

// ClipGlobalNorm scales every gradient so their global norm is at most max
// (no-op when max <= 0) and returns the norm before clipping.
func ClipGlobalNorm(params []*Param, max float64) float64 {
	n := GlobalNorm(params)
	if max > 0 && n > max {
		ScaleGrads(params, float32(max/n))
	}
	return n
}

// ScaleGrads multiplies every gradient by f.
func ScaleGrads(params []*Param, f float32) {
	for _, p := range params {
		for i := range p.Grad {
			p.Grad[i] *= f
		}
	}
}
