package ps

import (
	"fmt"
	"math"
)

// InitKind is how a row's values start.
type InitKind uint8

// Initialisers. Each is a pure function of (seed, table, key, column), so a
// row created on any replica, or again after a restart, is bitwise the same.
const (
	InitZeros InitKind = iota
	// InitUniform draws from [-Scale, Scale).
	InitUniform
	// InitNormal draws from N(0, Scale²).
	InitNormal
)

// OptimizerKind is a server-side optimizer.
type OptimizerKind uint8

// Server-side optimizers, each with per-row state ("lazy": a row's state
// moves only when the row gets a gradient).
const (
	SGD OptimizerKind = iota
	Adagrad
	Adam
)

// ParseOptimizer reads sgd, adagrad or adam.
func ParseOptimizer(s string) (OptimizerKind, error) {
	switch s {
	case "sgd":
		return SGD, nil
	case "adagrad":
		return Adagrad, nil
	case "adam":
		return Adam, nil
	}
	return 0, fmt.Errorf("ps: optimizer %q: want sgd, adagrad or adam", s)
}

func (k OptimizerKind) String() string {
	switch k {
	case SGD:
		return "sgd"
	case Adagrad:
		return "adagrad"
	case Adam:
		return "adam"
	}
	return fmt.Sprintf("optimizer(%d)", uint8(k))
}

// TableSpec describes a table. Every server and worker of a job holds the
// same specs (they are part of the job's configuration).
type TableSpec struct {
	ID   uint32
	Name string
	Dim  int
	// Rows, when not 0, makes the table dense: keys are 0..Rows-1 and a key
	// outside is an error. A sparse table (Rows 0) takes any uint64 key;
	// KeySpace, when not 0, is the range its keys are expected in (what a
	// range partition splits).
	Rows, KeySpace uint64
	Init           InitKind
	InitScale      float32
	Seed           uint64
	Optimizer      OptimizerKind
	LR             float32
	// Adam's moments decay (default 0.9, 0.999); Eps (default 1e-8 for
	// Adam, 1e-10 for Adagrad) keeps the division finite; Adagrad's
	// accumulators start at InitialAccumulator (default 0.1).
	Beta1, Beta2, Eps  float32
	InitialAccumulator float32
}

// Validate checks the spec and fills defaults.
func (s *TableSpec) Validate() error {
	switch {
	case s.Dim < 1 || s.Dim > MaxDim:
		return fmt.Errorf("ps: table %q: dim %d: want 1..%d", s.Name, s.Dim, MaxDim)
	case s.Optimizer > Adam:
		return fmt.Errorf("ps: table %q: unknown optimizer %d", s.Name, s.Optimizer)
	case s.Init > InitNormal:
		return fmt.Errorf("ps: table %q: unknown initialiser %d", s.Name, s.Init)
	case !(s.LR > 0) || math.IsInf(float64(s.LR), 0):
		return fmt.Errorf("ps: table %q: learning rate %v: want a positive number", s.Name, s.LR)
	case s.InitScale < 0 || math.IsNaN(float64(s.InitScale)):
		return fmt.Errorf("ps: table %q: init scale %v", s.Name, s.InitScale)
	}
	if s.Beta1 == 0 {
		s.Beta1 = 0.9
	}
	if s.Beta2 == 0 {
		s.Beta2 = 0.999
	}
	if s.Eps == 0 {
		s.Eps = 1e-8
		if s.Optimizer == Adagrad {
			s.Eps = 1e-10
		}
	}
	if s.InitialAccumulator == 0 {
		s.InitialAccumulator = 0.1
	}
	if !(s.Beta1 > 0 && s.Beta1 < 1 && s.Beta2 > 0 && s.Beta2 < 1 && s.Eps > 0) {
		return fmt.Errorf("ps: table %q: betas %v, %v and eps %v out of range", s.Name, s.Beta1, s.Beta2, s.Eps)
	}
	return nil
}

// stateFloats is how many floats of optimizer state a row carries.
func (s *TableSpec) stateFloats() int {
	switch s.Optimizer {
	case Adagrad:
		return s.Dim
	case Adam:
		return 2*s.Dim + 1 // m, v, and the row's step count
	}
	return 0
}

// CheckKey reports a key outside a dense table.
func (s *TableSpec) CheckKey(k uint64) error {
	if s.Rows != 0 && k >= s.Rows {
		return fmt.Errorf("ps: table %q: key %d outside its %d rows", s.Name, k, s.Rows)
	}
	return nil
}

const chunkShift = 14 // rows per storage chunk: 16384

// Rows holds one shard's rows of one table: values and optimizer state in
// chunks of float32s (never scanned by the garbage collector), indexed by
// key. It is not safe for concurrent use; its shard actor owns it.
type Rows struct {
	spec   TableSpec
	stride int // floats per row: Dim values, then optimizer state
	index  *index
	keys   []uint64
	chunks [][]float32
}

// NewRows is an empty set of rows of spec (validated).
func NewRows(spec TableSpec) *Rows {
	return &Rows{spec: spec, stride: spec.Dim + spec.stateFloats(), index: newIndex()}
}

// Spec is the table's spec.
func (r *Rows) Spec() *TableSpec { return &r.spec }

// Len is the number of rows created.
func (r *Rows) Len() int { return len(r.keys) }

// row returns the storage of row i: values then state.
func (r *Rows) row(i uint32) []float32 {
	c := r.chunks[i>>chunkShift]
	o := int(i&(1<<chunkShift-1)) * r.stride
	return c[o : o+r.stride : o+r.stride]
}

// get returns key's row, creating it with its initial values on first
// touch.
func (r *Rows) get(k uint64) []float32 {
	if i, ok := r.index.get(k); ok {
		return r.row(i)
	}
	i := uint32(len(r.keys))
	if int(i)>>chunkShift == len(r.chunks) {
		r.chunks = append(r.chunks, make([]float32, (1<<chunkShift)*r.stride))
	}
	r.index.put(k, i)
	r.keys = append(r.keys, k)
	row := r.row(i)
	initRow(&r.spec, k, row)
	return row
}

// initRow writes key's initial values and optimizer state into row.
func initRow(s *TableSpec, k uint64, row []float32) {
	v := row[:s.Dim]
	switch s.Init {
	case InitZeros:
		clear(v)
	case InitUniform:
		x := mix(s.Seed ^ uint64(s.ID)<<48 ^ k*0x9e3779b97f4a7c15)
		for j := range v {
			x = splitmix(x)
			v[j] = s.InitScale * (float32(x>>40)/(1<<24)*2 - 1)
		}
	case InitNormal:
		x := mix(s.Seed ^ uint64(s.ID)<<48 ^ k*0x9e3779b97f4a7c15)
		for j := 0; j < len(v); j += 2 {
			x = splitmix(x)
			u1 := (float64(x>>11) + 1) / (1 << 53)
			x = splitmix(x)
			u2 := float64(x>>11) / (1 << 53)
			r := math.Sqrt(-2 * math.Log(u1))
			v[j] = s.InitScale * float32(r*math.Cos(2*math.Pi*u2))
			if j+1 < len(v) {
				v[j+1] = s.InitScale * float32(r*math.Sin(2*math.Pi*u2))
			}
		}
	}
	st := row[s.Dim:]
	clear(st)
	if s.Optimizer == Adagrad {
		for j := range st {
			st[j] = s.InitialAccumulator
		}
	}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	return mix(x)
}

func mix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// Pull copies the values of keys' rows into out (len(keys) × Dim), creating
// rows on first touch.
func (r *Rows) Pull(keys []uint64, out []float32) {
	d := r.spec.Dim
	for i, k := range keys {
		copy(out[i*d:(i+1)*d], r.get(k)[:d])
	}
}

// Apply runs the optimizer on keys' rows with grads (len(keys) × Dim), each
// multiplied by scale. Keys may repeat; each occurrence is one update.
func (r *Rows) Apply(keys []uint64, grads []float32, scale float32) {
	s := &r.spec
	d := s.Dim
	for i, k := range keys {
		row := r.get(k)
		g := grads[i*d : (i+1)*d]
		w := row[:d]
		switch s.Optimizer {
		case SGD:
			a := -s.LR * scale
			for j := range w {
				w[j] += a * g[j]
			}
		case Adagrad:
			acc := row[d : 2*d]
			for j := range w {
				gj := g[j] * scale
				acc[j] += gj * gj
				w[j] -= s.LR * gj / (float32(math.Sqrt(float64(acc[j]))) + s.Eps)
			}
		case Adam:
			m, v := row[d:2*d], row[2*d:3*d]
			row[3*d]++
			t := float64(row[3*d])
			c1 := float32(1 - math.Pow(float64(s.Beta1), t))
			c2 := float32(1 - math.Pow(float64(s.Beta2), t))
			for j := range w {
				gj := g[j] * scale
				m[j] = s.Beta1*m[j] + (1-s.Beta1)*gj
				v[j] = s.Beta2*v[j] + (1-s.Beta2)*gj*gj
				w[j] -= s.LR * (m[j] / c1) / (float32(math.Sqrt(float64(v[j]/c2))) + s.Eps)
			}
		}
	}
}

// Each calls f with every row's key and storage (values, then optimizer
// state), in creation order.
func (r *Rows) Each(f func(key uint64, row []float32)) {
	for i, k := range r.keys {
		f(k, r.row(uint32(i)))
	}
}

// Stride is the number of floats Each gives per row.
func (r *Rows) Stride() int { return r.stride }

// Load sets key's whole row (values and state; len(row) == Stride()), as
// read from a checkpoint.
func (r *Rows) Load(k uint64, row []float32) error {
	if len(row) != r.stride {
		return fmt.Errorf("ps: table %q: a row of %d floats, want %d", r.spec.Name, len(row), r.stride)
	}
	copy(r.get(k), row)
	return nil
}
