// Package hybrid decides hybrid-synchronous training steps: when a step
// closes (every rank ready, or the deadline passed with a quorum; a parameter
// server's clock at a quorum, or at the deadline with one push), who took
// part and who is stale, what the next deadline is, and which persistent
// stragglers to exclude from the ring or readmit to it.
//
// Every decision is a pure function of readiness reports (durations since a
// step opened) and of a History the caller keeps; nothing here reads a clock,
// sleeps or talks to the network, so the step leader, the coordinator and the
// tests all get the same answers from the same inputs.
package hybrid

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Policy is the hybrid-synchronous configuration of a job.
type Policy struct {
	// Deadline is the fixed step deadline; with Auto it is replaced by
	// AutoFactor × the median of the last AutoWindow closed steps' times
	// (Deadline until there are any).
	Deadline   time.Duration
	Auto       bool
	AutoFactor float64 // default 2
	AutoWindow int     // default 20
	// Quorum is the fraction of the ring needed to close a step at its
	// deadline (0 < Quorum <= 1); short of it the step waits.
	Quorum float64
	// A rank late in at least ExcludeAfter of the last Window steps is
	// excluded; an excluded rank that would have met the deadline in
	// ReadmitAfter consecutive steps is readmitted. The ring is never made
	// smaller than MinWorkers.
	ExcludeAfter, Window int
	ReadmitAfter         int
	MinWorkers           int
	// A step runs overlapped (each rank sends its gradient buckets while
	// its backward pass runs) once every rank was ready within
	// OverlapMargin × the deadline in each of the last OverlapAfter steps
	// (defaults 3 and 0.8); NoOverlap never overlaps. See Overlap.
	NoOverlap     bool
	OverlapAfter  int
	OverlapMargin float64
}

// Validate checks the policy and fills defaults.
func (p *Policy) Validate() error {
	if p.AutoFactor == 0 {
		p.AutoFactor = 2
	}
	if p.AutoWindow == 0 {
		p.AutoWindow = 20
	}
	if p.OverlapAfter == 0 {
		p.OverlapAfter = defaultOverlapAfter
	}
	if p.OverlapMargin == 0 {
		p.OverlapMargin = defaultOverlapMargin
	}
	switch {
	case p.Deadline <= 0:
		return fmt.Errorf("hybrid: step deadline %v: must be positive (the first deadline, with auto)", p.Deadline)
	case p.AutoFactor < 1 || math.IsNaN(p.AutoFactor) || p.AutoWindow < 1:
		return fmt.Errorf("hybrid: auto deadline factor %v and window %d: want a factor >= 1 and a window >= 1", p.AutoFactor, p.AutoWindow)
	case !(p.Quorum > 0 && p.Quorum <= 1):
		return fmt.Errorf("hybrid: quorum %v: want a fraction in (0, 1]", p.Quorum)
	case p.Window < 0 || p.ExcludeAfter < 0 || p.ExcludeAfter > p.Window || (p.Window > 0 && p.ExcludeAfter == 0):
		return fmt.Errorf("hybrid: exclude after %d of %d steps: want 1 <= X <= W (or 0/0: never)", p.ExcludeAfter, p.Window)
	case p.ReadmitAfter < 0 || p.MinWorkers < 0:
		return fmt.Errorf("hybrid: readmit-after and min-workers must not be negative")
	case p.OverlapAfter < 1 || !(p.OverlapMargin > 0 && p.OverlapMargin <= 1):
		return fmt.Errorf("hybrid: overlap after %d steps within %v of the deadline: want at least 1 step and a fraction in (0, 1]", p.OverlapAfter, p.OverlapMargin)
	}
	return nil
}

// ParseExcludeAfter reads "X/W".
func ParseExcludeAfter(s string) (x, w int, err error) {
	a, b, ok := strings.Cut(s, "/")
	x, err1 := strconv.Atoi(strings.TrimSpace(a))
	w, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || x < 1 || w < x {
		return 0, 0, fmt.Errorf("hybrid: exclude-after %q: want X/W with 1 <= X <= W, such as 3/10", s)
	}
	return x, w, nil
}

// quorum is how many of world ranks the fraction q requires: at least one,
// and all of them for q = 1.
func quorum(q float64, world int) int {
	return max(1, int(math.Ceil(q*float64(world)-1e-9)))
}

// Rule is when a step closes short of every rank being ready.
type Rule uint8

const (
	// CloseAtDeadline: at the deadline, once a quorum is ready. The ring's
	// steps (Policy.Close).
	CloseAtDeadline Rule = iota
	// CloseAtQuorum: as soon as a quorum is ready, or at the deadline with
	// at least one. The parameter server's hybrid clocks.
	CloseAtQuorum
)

// Closes reports whether a step of world ranks, ready of them ready, closes
// now: when every rank is ready, and otherwise as the rule says, with q the
// quorum as a fraction of world.
func (r Rule) Closes(ready, world int, q float64, deadlinePassed bool) bool {
	if ready >= world {
		return true
	}
	need := quorum(q, world)
	if r == CloseAtQuorum {
		return ready >= need || deadlinePassed && ready > 0
	}
	return deadlinePassed && ready >= need
}

// NotReady marks a rank whose readiness has not arrived.
const NotReady time.Duration = -1

// Close decides whether a step of len(ready) ranks closes now. ready[r] is
// how long after the step opened rank r reported ready (NotReady: not yet);
// elapsed is how long the step has been open, deadline its deadline. A step
// closes when every rank is ready, or at the deadline once a quorum is; the
// participants are the ranks ready when it closes.
func (p Policy) Close(ready []time.Duration, elapsed, deadline time.Duration) (closed bool, participants []bool) {
	n := 0
	for _, t := range ready {
		if t != NotReady && t <= elapsed {
			n++
		}
	}
	if !CloseAtDeadline.Closes(n, len(ready), p.Quorum, elapsed >= deadline) {
		return false, nil
	}
	participants = make([]bool, len(ready))
	for r, t := range ready {
		participants[r] = t != NotReady && t <= elapsed
	}
	return true, participants
}

// StepTime is what a closed step tells the adaptive deadline: how long the
// median rank took to be ready (ready[r] as in Close), so that a slow
// minority does not stretch the deadline and a step closed without it still
// counts; or, when the step closed before half the ranks were ready, how long
// it was open, so that a deadline too short for most ranks grows by the
// factor with each such step.
func StepTime(ready []time.Duration, elapsed time.Duration) time.Duration {
	s := make([]time.Duration, len(ready))
	for r, t := range ready {
		s[r] = t
		if t == NotReady || t > elapsed {
			s[r] = math.MaxInt64
		}
	}
	slices.Sort(s)
	if len(s) == 0 || s[len(s)/2] == math.MaxInt64 {
		return elapsed
	}
	return s[len(s)/2]
}

// NextDeadline is the deadline of the next step given the StepTimes of recent
// closed steps (oldest first).
func (p Policy) NextDeadline(recent []time.Duration) time.Duration {
	if !p.Auto || len(recent) == 0 {
		return p.Deadline
	}
	return time.Duration(float64(Median(recent[max(0, len(recent)-p.AutoWindow):])) * p.AutoFactor)
}

// Straggler is a member to exclude: late in LateIn of its last Window steps.
type Straggler struct {
	ID     string
	LateIn int
}

// History is what the exclusion and readmission decisions remember, keyed by
// a worker's stable id (ranks change between generations).
type History struct {
	late    map[string][]bool // the last Window steps of each ring member: late or not
	exclude map[string]bool   // currently excluded
}

// NewHistory is an empty history.
func NewHistory() *History {
	return &History{late: map[string][]bool{}, exclude: map[string]bool{}}
}

// Excluded reports whether id is excluded.
func (h *History) Excluded(id string) bool { return h.exclude[id] }

// Record adds a closed step of the ring members (ids in rank order) and
// whether each took part, and returns whom to exclude now: members late in
// at least ExcludeAfter of their last Window steps, the latest first, as many
// as the ring can lose without going below MinWorkers (and always keeping
// one). Excluded members' histories are cleared.
func (p Policy) Record(h *History, members []string, participants []bool) (exclude []Straggler) {
	for i, id := range members {
		l := append(h.late[id], !participants[i])
		if len(l) > p.Window {
			l = l[len(l)-p.Window:]
		}
		h.late[id] = l
	}
	if p.Window == 0 {
		return nil
	}
	type cand struct {
		id   string
		late int
		rank int
	}
	var cands []cand
	for i, id := range members {
		n := 0
		for _, l := range h.late[id] {
			if l {
				n++
			}
		}
		if n >= p.ExcludeAfter && !h.exclude[id] {
			cands = append(cands, cand{id, n, i})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.late != b.late {
			return b.late - a.late
		}
		return a.rank - b.rank
	})
	room := len(members) - max(p.MinWorkers, 1)
	for _, c := range cands[:min(len(cands), max(room, 0))] {
		exclude = append(exclude, Straggler{ID: c.id, LateIn: c.late})
		h.exclude[c.id] = true
		delete(h.late, c.id)
	}
	return exclude
}

// LateIn is how many of its last Window steps member id was late in.
func (h *History) LateIn(id string) int {
	n := 0
	for _, l := range h.late[id] {
		if l {
			n++
		}
	}
	return n
}

// Rejoined clears the exclusion of every member of a new generation: a
// readmitted worker is judged afresh and can be excluded again.
func (h *History) Rejoined(members []string) {
	for _, id := range members {
		delete(h.exclude, id)
	}
}

// Overhead is the part of a closed step's readiness times that is not the
// ranks' own compute (the decision's delivery, the reduction, the update):
// the median over the ranks ready by elapsed of ready[r] - compute[r], and
// false when none was.
func Overhead(ready, compute []time.Duration, elapsed time.Duration) (time.Duration, bool) {
	var s []time.Duration
	for r, t := range ready {
		if t != NotReady && t <= elapsed {
			s = append(s, max(0, t-compute[r]))
		}
	}
	if len(s) == 0 {
		return 0, false
	}
	return Median(s), true
}

// Median is the median of d (the mean of the middle two for an even
// count; 0 for none). d is not modified.
func Median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// Probation decides when an excluded worker is readmitted: it times its own
// steps, and would have met the ring's Deadline when its compute plus the
// ring's Overhead does; ReadmitAfter such steps in a row readmit it.
type Probation struct {
	Deadline, Overhead time.Duration
	ReadmitAfter       int
	onTime             int
}

// Observe records a probation step's compute time and reports whether to
// readmit the worker now.
func (p *Probation) Observe(compute time.Duration) (readmit bool) {
	if compute+p.Overhead <= p.Deadline {
		p.onTime++
	} else {
		p.onTime = 0
	}
	return p.onTime >= max(p.ReadmitAfter, 1)
}
