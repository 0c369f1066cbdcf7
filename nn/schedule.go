package nn

import (
	"fmt"
	"math"
)

// Schedule is a learning-rate schedule: a linear warm-up from 0 over Warmup
// steps, then constant, step decay (×Gamma every Every steps) or cosine decay
// to Min at Total steps.
type Schedule struct {
	Kind   string // constant, step or cosine
	Base   float64
	Warmup int64
	Every  int64   // step: decay period
	Gamma  float64 // step: decay factor
	Total  int64   // cosine: the step where Min is reached
	Min    float64 // cosine: the floor
}

// Validate reports a schedule that cannot be followed.
func (s Schedule) Validate() error {
	switch {
	case s.Base <= 0 || math.IsInf(s.Base, 0) || math.IsNaN(s.Base):
		return fmt.Errorf("nn: learning rate %v: want a positive number", s.Base)
	case s.Warmup < 0:
		return fmt.Errorf("nn: warm-up of %d steps: must not be negative", s.Warmup)
	}
	switch s.Kind {
	case "", "constant":
	case "step":
		if s.Every <= 0 || s.Gamma <= 0 || s.Gamma > 1 {
			return fmt.Errorf("nn: step schedule needs a positive period (got %d) and a factor in (0, 1] (got %v)", s.Every, s.Gamma)
		}
	case "cosine":
		if s.Total <= s.Warmup {
			return fmt.Errorf("nn: cosine schedule over %d steps ends before its %d warm-up steps", s.Total, s.Warmup)
		}
		if s.Min < 0 || s.Min > s.Base {
			return fmt.Errorf("nn: cosine floor %v: want [0, %v]", s.Min, s.Base)
		}
	default:
		return fmt.Errorf("nn: unknown schedule %q: want constant, step or cosine", s.Kind)
	}
	return nil
}

// LR is the learning rate of step (counted from 0).
func (s Schedule) LR(step int64) float32 {
	if step < s.Warmup {
		return float32(s.Base * float64(step+1) / float64(s.Warmup))
	}
	t := step - s.Warmup
	switch s.Kind {
	case "step":
		return float32(s.Base * math.Pow(s.Gamma, float64(t/s.Every)))
	case "cosine":
		span := float64(s.Total - s.Warmup)
		frac := min(float64(t)/span, 1)
		return float32(s.Min + (s.Base-s.Min)*(1+math.Cos(math.Pi*frac))/2)
	}
	return float32(s.Base)
}
