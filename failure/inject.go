// Package failure holds fault injection for tests and benchmarks: a rank made
// slower for a range of steps, or paused once. The specs are parsed from flags
// and answer, per rank and step, how much to slow down or how long to pause;
// the training loop applies them.
package failure

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Slow makes Rank's compute Factor times slower for steps From..To
// (inclusive; To 0: to the end).
type Slow struct {
	Rank     int
	Factor   float64
	From, To int64
}

// Pause stops Rank for For at step At.
type Pause struct {
	Rank int
	At   int64
	For  time.Duration
}

// WrongOp makes Rank call a collective operation the others do not (a
// barrier) before its model code of step At: a hang for the hang
// recorder to name.
type WrongOp struct {
	Rank int
	At   int64
}

// Injection is every injected fault of a job.
type Injection struct {
	Slow    []Slow
	Pause   []Pause
	WrongOp []WrongOp `json:",omitempty"`
}

// WrongOpAt says whether rank calls the wrong operation before step.
func (in Injection) WrongOpAt(rank int, step int64) bool {
	return slices.ContainsFunc(in.WrongOp, func(w WrongOp) bool { return w.Rank == rank && w.At == step })
}

// ParseWrongOp reads "rank=R,at=S".
func ParseWrongOp(spec string) (WrongOp, error) {
	f, err := fields(spec, "rank", "at")
	if err != nil {
		return WrongOp{}, fmt.Errorf("--inject-wrong-op %q: %w", spec, err)
	}
	var w WrongOp
	var errs []string
	if w.Rank, err = strconv.Atoi(f["rank"]); err != nil || w.Rank < 0 {
		errs = append(errs, "rank: want a rank from 0")
	}
	if w.At, err = strconv.ParseInt(f["at"], 10, 64); err != nil || w.At < 1 {
		errs = append(errs, "at: want a step from 1")
	}
	if len(errs) > 0 {
		return WrongOp{}, fmt.Errorf("--inject-wrong-op %q: %s", spec, strings.Join(errs, "; "))
	}
	return w, nil
}

// Factor is how many times slower rank computes step.
func (in Injection) Factor(rank int, step int64) float64 {
	f := 1.0
	for _, s := range in.Slow {
		if s.Rank == rank && step >= s.From && (s.To == 0 || step <= s.To) {
			f *= s.Factor
		}
	}
	return f
}

// PauseAt is how long rank pauses before step (0: not at all).
func (in Injection) PauseAt(rank int, step int64) time.Duration {
	var d time.Duration
	for _, p := range in.Pause {
		if p.Rank == rank && p.At == step {
			d += p.For
		}
	}
	return d
}

// fields reads "k=v,k=v" with the keys allowed, each at most once.
func fields(spec string, allowed ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		switch {
		case !ok || v == "":
			return nil, fmt.Errorf("%q is not key=value", kv)
		case !slices.Contains(allowed, k):
			return nil, fmt.Errorf("unknown key %q (known: %s)", k, strings.Join(allowed, ", "))
		case out[k] != "":
			return nil, fmt.Errorf("%s given twice", k)
		}
		out[k] = v
	}
	return out, nil
}

// ParseSlow reads "rank=R,factor=F[,from=S,to=T]".
func ParseSlow(spec string) (Slow, error) {
	f, err := fields(spec, "rank", "factor", "from", "to")
	if err != nil {
		return Slow{}, fmt.Errorf("--inject-slow %q: %w", spec, err)
	}
	var s Slow
	var errs []string
	s.Rank, err = strconv.Atoi(f["rank"])
	if err != nil || s.Rank < 0 {
		errs = append(errs, "rank: want a rank from 0")
	}
	s.Factor, err = strconv.ParseFloat(f["factor"], 64)
	if err != nil || !(s.Factor >= 1 && s.Factor <= 1000) {
		errs = append(errs, "factor: want a number from 1 to 1000")
	}
	s.From, s.To = 1, 0
	if v := f["from"]; v != "" {
		if s.From, err = strconv.ParseInt(v, 10, 64); err != nil || s.From < 1 {
			errs = append(errs, "from: want a step from 1")
		}
	}
	if v := f["to"]; v != "" {
		if s.To, err = strconv.ParseInt(v, 10, 64); err != nil || s.To < s.From {
			errs = append(errs, "to: want a step from 'from' on")
		}
	}
	if len(errs) > 0 {
		return Slow{}, fmt.Errorf("--inject-slow %q: %s", spec, strings.Join(errs, "; "))
	}
	return s, nil
}

// ParsePause reads "rank=R,at=S,for=D".
func ParsePause(spec string) (Pause, error) {
	f, err := fields(spec, "rank", "at", "for")
	if err != nil {
		return Pause{}, fmt.Errorf("--inject-pause %q: %w", spec, err)
	}
	var p Pause
	var errs []string
	if p.Rank, err = strconv.Atoi(f["rank"]); err != nil || p.Rank < 0 {
		errs = append(errs, "rank: want a rank from 0")
	}
	if p.At, err = strconv.ParseInt(f["at"], 10, 64); err != nil || p.At < 1 {
		errs = append(errs, "at: want a step from 1")
	}
	if p.For, err = time.ParseDuration(f["for"]); err != nil || p.For <= 0 {
		errs = append(errs, "for: want a positive duration such as 2s")
	}
	if len(errs) > 0 {
		return Pause{}, fmt.Errorf("--inject-pause %q: %s", spec, strings.Join(errs, "; "))
	}
	return p, nil
}
