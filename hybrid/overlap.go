package hybrid

import "time"

const (
	defaultOverlapAfter  = 3
	defaultOverlapMargin = 0.8
	// maxOverlapBackoff caps how many times OverlapAfter on-time steps an
	// overlap needs after repeated fallbacks.
	maxOverlapBackoff = 64
)

// Overlap decides, step by step, whether the ring's next step runs
// overlapped: each rank sends its gradient buckets to be reduced while its
// backward pass runs, as a bulk-synchronous step does, instead of once the
// step has closed. Overlap hides the reduction behind the backward pass, but
// a rank that has sent a bucket is in the step's sum: if it is late the step
// waits for it (a rank that is late before its first bucket still drops out
// at the deadline). So a step is overlapped only after OverlapAfter steps in
// a row in which every rank was ready within OverlapMargin × the deadline;
// an overlapped step in which some rank was not ready by the deadline is a
// fallback: the next steps close at the deadline again, and each fallback in
// a row doubles the on-time steps the next overlap needs (up to
// 64 × OverlapAfter), halved again after as many overlapped steps on time.
//
// The step leader keeps one per ring and announces its answer with each
// step's decision; the zero value is ready for use with a Policy's
// defaults.
type Overlap struct {
	streak int // steps in a row with every rank well on time
	need   int // on-time steps the next overlap needs (0: OverlapAfter)
	good   int // overlapped steps in a row on time
}

// Closed records a closed step of the ring: whether it ran overlapped, when
// each rank was ready (as in Close; NotReady: not by the close), its deadline
// and how long it was open. It reports whether the next step runs overlapped
// and whether this one was a fallback. first marks a generation's first step,
// whose times are only the spread of the ranks' readiness: it breaks no
// streak and starts none.
func (p Policy) Closed(o *Overlap, overlapped bool, ready []time.Duration, deadline, elapsed time.Duration, first bool) (next, fallback bool) {
	after, margin := p.OverlapAfter, p.OverlapMargin
	if after < 1 {
		after = defaultOverlapAfter
	}
	if !(margin > 0 && margin <= 1) {
		margin = defaultOverlapMargin
	}
	if o.need < after {
		o.need = after
	}
	well, inTime := true, true
	for _, t := range ready {
		if t == NotReady || t > elapsed || t > deadline {
			inTime = false
		}
		if t == NotReady || t > elapsed || float64(t) > margin*float64(deadline) {
			well = false
		}
	}
	switch {
	case first && !overlapped:
	case overlapped && !inTime:
		fallback = true
		o.streak, o.good = 0, 0
		o.need = min(2*o.need, maxOverlapBackoff*after)
	case well:
		o.streak++
		if overlapped {
			if o.good++; o.good >= o.need {
				o.need, o.good = max(after, o.need/2), 0
			}
		}
	default:
		o.streak, o.good = 0, 0
	}
	if p.NoOverlap {
		return false, fallback
	}
	return o.streak >= o.need, fallback
}

// Need is how many steps in a row with every rank well on time the next
// overlap needs (OverlapAfter, more after fallbacks).
func (o *Overlap) Need() int { return o.need }
