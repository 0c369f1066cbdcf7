// Package sparselr is the parameter server's example model: logistic
// regression on a synthetic click log whose feature ids follow a Zipf law,
// the shape of recommendation and advertising data where the model is a
// huge, sparsely touched embedding table (here of width 1).
//
// The log is a pure function of its seed: a teacher model gives every id a
// weight from N(0, σ²), each example draws Features ids by Zipf and is
// clicked with probability sigmoid(bias + Σ weights). The teacher's own
// probabilities score the held-out set at the best AUC any model can reach
// on it (BayesAUC); the trained model is judged against it.
package sparselr

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// Config describes a synthetic click log.
type Config struct {
	IDs      int     // feature ids 0..IDs-1 (default 1,000,000)
	Features int     // ids per example (default 16)
	Zipf     float64 // the exponent of the ids' Zipf law (default 1.2)
	Sigma    float64 // the teacher's weight spread (default 0.45: a best AUC of about 0.82)
	Bias     float64 // the teacher's bias (default -1: about three clicks in ten)
	Seed     uint64
}

func (c *Config) defaults() error {
	if c.IDs == 0 {
		c.IDs = 1_000_000
	}
	if c.Features == 0 {
		c.Features = 16
	}
	if c.Zipf == 0 {
		c.Zipf = 1.2
	}
	if c.Sigma == 0 {
		c.Sigma = 0.45
	}
	if c.Bias == 0 {
		c.Bias = -1
	}
	switch {
	case c.IDs < 2 || c.IDs > 1<<40:
		return fmt.Errorf("sparselr: %d ids: want 2..2^40", c.IDs)
	case c.Features < 1 || c.Features > 1024:
		return fmt.Errorf("sparselr: %d features per example: want 1..1024", c.Features)
	case !(c.Zipf > 0) || math.IsInf(c.Zipf, 0):
		return fmt.Errorf("sparselr: Zipf exponent %v: want a positive number", c.Zipf)
	case !(c.Sigma > 0) || math.IsInf(c.Sigma, 0):
		return fmt.Errorf("sparselr: sigma %v: want a positive number", c.Sigma)
	}
	return nil
}

// Log is a click log: example i has ids IDs[i*Features:(i+1)*Features]
// (distinct) and label Clicked[i].
type Log struct {
	Features int
	IDs      []uint64
	Clicked  []bool
	// Truth is the teacher's click probability of each example.
	Truth []float32
}

// Len is the number of examples.
func (l *Log) Len() int { return len(l.Clicked) }

// Example returns example i's ids.
func (l *Log) Example(i int) []uint64 { return l.IDs[i*l.Features : (i+1)*l.Features] }

// Generator draws click logs of one Config.
type Generator struct {
	cfg Config
	cdf []float64 // Zipf: cdf[k] = P(id <= k)
}

// NewGenerator prepares the Zipf table of cfg.
func NewGenerator(cfg Config) (*Generator, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	cdf := make([]float64, cfg.IDs)
	sum := 0.0
	for k := range cdf {
		sum += math.Pow(float64(k+1), -cfg.Zipf)
		cdf[k] = sum
	}
	for k := range cdf {
		cdf[k] /= sum
	}
	return &Generator{cfg: cfg, cdf: cdf}, nil
}

// Config is the generator's configuration, defaults filled.
func (g *Generator) Config() Config { return g.cfg }

// TeacherWeight is the teacher's weight of id: a pure function of the seed
// and the id.
func (g *Generator) TeacherWeight(id uint64) float64 {
	x := splitmix(g.cfg.Seed ^ 0x7eac4e5 ^ id*0x9e3779b97f4a7c15)
	u1 := (float64(x>>11) + 1) / (1 << 53)
	x = splitmix(x)
	u2 := float64(x>>11) / (1 << 53)
	return g.cfg.Sigma * math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// Draw generates n examples of part part (0: training, 1: held out, ...):
// different parts are independent draws of the same teacher.
func (g *Generator) Draw(n int, part uint64) *Log {
	f := g.cfg.Features
	rng := rand.New(rand.NewPCG(g.cfg.Seed, 0x5eed+part))
	l := &Log{Features: f, IDs: make([]uint64, 0, n*f), Clicked: make([]bool, n), Truth: make([]float32, n)}
	ex := make([]uint64, 0, f)
	for i := range n {
		ex = ex[:0]
		for len(ex) < f {
			id := uint64(sort.SearchFloat64s(g.cdf, rng.Float64()))
			if id >= uint64(len(g.cdf)) {
				id = uint64(len(g.cdf) - 1)
			}
			if !slices.Contains(ex, id) {
				ex = append(ex, id)
			}
		}
		z := g.cfg.Bias
		for _, id := range ex {
			z += g.TeacherWeight(id)
		}
		p := 1 / (1 + math.Exp(-z))
		l.IDs = append(l.IDs, ex...)
		l.Truth[i] = float32(p)
		l.Clicked[i] = rng.Float64() < p
	}
	return l
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// AUC is the area under the ROC curve of scores for labels: the probability
// that a clicked example scores above an unclicked one (ties count half).
// It is NaN when either class is missing.
func AUC(scores []float32, labels []bool) float64 {
	idx := make([]int, len(scores))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case scores[a] < scores[b]:
			return -1
		case scores[a] > scores[b]:
			return 1
		}
		return 0
	})
	var pos, neg, rankSum float64
	for i := 0; i < len(idx); {
		j := i
		for j < len(idx) && scores[idx[j]] == scores[idx[i]] {
			j++
		}
		mid := float64(i+j+1) / 2 // the average rank (from 1) of the tie group
		for _, k := range idx[i:j] {
			if labels[k] {
				pos++
				rankSum += mid
			} else {
				neg++
			}
		}
		i = j
	}
	if pos == 0 || neg == 0 {
		return math.NaN()
	}
	return (rankSum - pos*(pos+1)/2) / (pos * neg)
}

// LogLoss is the mean negative log-likelihood of labels under probabilities
// p (clipped to [1e-7, 1-1e-7]).
func LogLoss(p []float32, labels []bool) float64 {
	s := 0.0
	for i, q := range p {
		x := math.Min(math.Max(float64(q), 1e-7), 1-1e-7)
		if labels[i] {
			s -= math.Log(x)
		} else {
			s -= math.Log(1 - x)
		}
	}
	return s / float64(len(p))
}

// BayesAUC is the AUC of the teacher's own probabilities on l: the best any
// model can reach on it.
func BayesAUC(l *Log) float64 { return AUC(l.Truth, l.Clicked) }
