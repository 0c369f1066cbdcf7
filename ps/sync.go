package ps

import (
	"fmt"
	"math"
	"time"

	"github.com/phalanx-rt/phalanx/hybrid"
)

// Mode is a consistency model: when pushed gradients become visible to
// pulls.
type Mode uint8

// Consistency models.
const (
	// BSP: a shard's clock advances when every worker pushed it; the
	// gradients of a clock are averaged and applied together, and a pull
	// for clock c waits until every clock before c is applied.
	BSP Mode = iota + 1
	// ASP: a push is applied on arrival; pulls never wait.
	ASP
	// SSP: a push is applied on arrival; a worker at clock c waits on pull
	// until the slowest worker has pushed clock c-s-1 (it is at most s
	// clocks ahead of the slowest).
	SSP
	// Hybrid: like BSP, but a clock closes once a quorum of workers pushed
	// it or at its deadline; a later push for a closed clock is stale:
	// dropped, or decayed into the open clock's update.
	Hybrid
)

// ParseMode reads bsp, asp, ssp or hybrid.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "bsp":
		return BSP, nil
	case "asp", "async":
		return ASP, nil
	case "ssp":
		return SSP, nil
	case "hybrid":
		return Hybrid, nil
	}
	return 0, fmt.Errorf("ps: consistency %q: want bsp, asp, ssp or hybrid", s)
}

func (m Mode) String() string {
	switch m {
	case BSP:
		return "bsp"
	case ASP:
		return "asp"
	case SSP:
		return "ssp"
	case Hybrid:
		return "hybrid"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// SyncSpec is a job's consistency configuration.
type SyncSpec struct {
	Mode    Mode
	Workers int
	// Staleness is SSP's bound s.
	Staleness int
	// Quorum (hybrid) is the fraction of workers whose pushes close a
	// clock; Deadline closes it with fewer (at least one).
	Quorum   float64
	Deadline time.Duration
	// Decay (hybrid), when not 0, applies a stale push scaled by it in the
	// open clock instead of dropping it.
	Decay float32
}

// Validate checks the spec.
func (s SyncSpec) Validate() error {
	switch {
	case s.Mode < BSP || s.Mode > Hybrid:
		return fmt.Errorf("ps: unknown consistency %d", s.Mode)
	case s.Workers < 1 || s.Workers > 1<<16:
		return fmt.Errorf("ps: %d workers: want 1..65536", s.Workers)
	case s.Mode == SSP && s.Staleness < 0:
		return fmt.Errorf("ps: ssp staleness %d: must not be negative", s.Staleness)
	case s.Mode == Hybrid && !(s.Quorum > 0 && s.Quorum <= 1):
		return fmt.Errorf("ps: hybrid quorum %v: want a fraction in (0, 1]", s.Quorum)
	case s.Mode == Hybrid && s.Deadline <= 0:
		return fmt.Errorf("ps: hybrid deadline %v: must be positive", s.Deadline)
	case s.Decay < 0 || s.Decay > 1 || math.IsNaN(float64(s.Decay)):
		return fmt.Errorf("ps: stale decay %v: want a factor in [0, 1]", s.Decay)
	}
	return nil
}

// aggregates reports whether the mode sums a clock's pushes and applies
// them when the clock closes.
func (m Mode) aggregates() bool { return m == BSP || m == Hybrid }

// PushAction is what a shard does with a push.
type PushAction uint8

const (
	// ApplyNow: apply the gradients to the rows (asp, ssp).
	ApplyNow PushAction = iota + 1
	// Aggregate: add them to the open clock's sum (bsp, hybrid).
	Aggregate
	// StaleDrop: the push's clock closed (hybrid): drop it.
	StaleDrop
	// StaleDecay: the push's clock closed (hybrid): add it, scaled by the
	// decay, to the open clock's sum without counting it as a participant.
	StaleDecay
	// Duplicate: this push was applied already (a retry after a
	// failover): acknowledge it and do nothing.
	Duplicate
)

// Clocks is a shard's consistency state. It decides what to do with each
// push and whether a pull can be served, as a pure function of the pushes
// and closes it was given: no clock reads, no I/O. A primary and its backups
// feed theirs the same sequence (the primary decides the closes) and agree.
type Clocks struct {
	spec SyncSpec
	// open is the clock being pushed (bsp, hybrid): every clock before it
	// is applied.
	open    int64
	pushed  []bool // who pushed the open clock
	npushed int
	// next is each worker's next clock (asp, ssp): it pushed every clock
	// before it.
	next []int64
	// lastID is each worker's last push id taken: a push id not above it
	// is a duplicate.
	lastID []uint64
	// applied and dups count each worker's pushes taken and refused as
	// duplicates since base (the clock the shard started or was restored
	// at): the evidence that no push is lost or applied twice. applied is
	// counted where a push is applied (Took), not where Push decided.
	applied, dups []uint64
	base          int64
	// top is each worker's highest push id taken; again and skipped are
	// the first id taken out of sequence (Took): counts alone cannot say
	// which step, and a step lost beside one applied twice leaves them
	// even.
	top, again, skipped []uint64
}

// NewClocks is a shard's consistency state at clock 0.
func NewClocks(spec SyncSpec) (*Clocks, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	n := spec.Workers
	return &Clocks{spec: spec, pushed: make([]bool, n), next: make([]int64, n), lastID: make([]uint64, n),
		applied: make([]uint64, n), dups: make([]uint64, n), top: make([]uint64, n), again: make([]uint64, n), skipped: make([]uint64, n)}, nil
}

// Spec is the configuration.
func (c *Clocks) Spec() SyncSpec { return c.spec }

// Push decides what to do with worker's push id for clock. A push that
// breaks the protocol (a bad worker, a clock ahead of the open one, a
// second push of the same clock) is an error and changes nothing. The
// caller applies the push as decided and counts it with Took (a
// duplicate is counted here).
func (c *Clocks) Push(worker int, id uint64, clock int64) (PushAction, error) {
	if worker < 0 || worker >= c.spec.Workers {
		return 0, fmt.Errorf("ps: push from worker %d of %d", worker, c.spec.Workers)
	}
	if clock < 0 {
		return 0, fmt.Errorf("ps: push of worker %d for clock %d", worker, clock)
	}
	if id != 0 && id <= c.lastID[worker] {
		c.dups[worker]++
		return Duplicate, nil
	}
	var act PushAction
	switch c.spec.Mode {
	case ASP, SSP:
		if clock < c.next[worker] {
			return 0, fmt.Errorf("ps: worker %d pushed clock %d after clock %d", worker, clock, c.next[worker]-1)
		}
		c.next[worker] = clock + 1
		act = ApplyNow
	case BSP, Hybrid:
		switch {
		case clock > c.open:
			return 0, fmt.Errorf("ps: worker %d pushed clock %d while clock %d is open", worker, clock, c.open)
		case clock < c.open && c.spec.Mode == BSP:
			return 0, fmt.Errorf("ps: worker %d pushed clock %d, closed already (bsp waits for every worker)", worker, clock)
		case clock < c.open:
			act = StaleDrop
			if c.spec.Decay > 0 {
				act = StaleDecay
			}
		case c.pushed[worker]:
			return 0, fmt.Errorf("ps: worker %d pushed clock %d twice", worker, clock)
		default:
			c.pushed[worker] = true
			c.npushed++
			act = Aggregate
		}
	}
	if id != 0 {
		c.lastID[worker] = id
	}
	return act, nil
}

// Took counts worker's push id as taken (applied, aggregated or stale)
// where the shard applied it, so that a push applied against Push's
// decision is counted all the same. It keeps the first id taken out of
// sequence: again, an id not above one taken before (a step applied
// twice); skipped, the first id missing below one taken (a step lost;
// not under asp, where a step pushes only the shards its keys fall on).
func (c *Clocks) Took(worker int, id uint64) {
	if worker < 0 || worker >= len(c.applied) {
		return
	}
	c.applied[worker]++
	if id == 0 {
		return
	}
	switch top := c.top[worker]; {
	case id <= top && c.again[worker] == 0:
		c.again[worker] = id
	case id > top+1 && c.spec.Mode != ASP && c.skipped[worker] == 0:
		c.skipped[worker] = top + 1
	}
	c.top[worker] = max(c.top[worker], id)
}

// ShouldClose reports whether the open clock closes now (bsp, hybrid):
// every worker pushed, or (hybrid, by hybrid.CloseAtQuorum) a quorum did, or
// the deadline passed with at least one.
func (c *Clocks) ShouldClose(deadlinePassed bool) bool {
	switch c.spec.Mode {
	case BSP:
		return c.npushed == c.spec.Workers
	case Hybrid:
		return hybrid.CloseAtQuorum.Closes(c.npushed, c.spec.Workers, c.spec.Quorum, deadlinePassed)
	}
	return false
}

// Close closes the open clock and returns how many workers pushed it (what
// its summed gradients are divided by).
func (c *Clocks) Close() (participants int) {
	participants = c.npushed
	c.open++
	clear(c.pushed)
	c.npushed = 0
	return participants
}

// Open is the open clock (bsp, hybrid) and Pushed how many pushed it.
func (c *Clocks) Open() (clock int64, pushed int) { return c.open, c.npushed }

// Slowest is the clock of the slowest worker (asp, ssp): every worker pushed
// every clock before it.
func (c *Clocks) Slowest() int64 {
	m := c.next[0]
	for _, n := range c.next[1:] {
		m = min(m, n)
	}
	return m
}

// Clock is the shard's clock as answers report it: the open clock (bsp,
// hybrid) or the slowest worker's (asp, ssp).
func (c *Clocks) Clock() int64 {
	if c.spec.Mode.aggregates() {
		return c.open
	}
	return c.Slowest()
}

// CanPull reports whether a pull by a worker at clock can be served now:
// bsp and hybrid once every clock before it is applied; ssp once the
// slowest worker is at most Staleness clocks behind; asp always.
func (c *Clocks) CanPull(clock int64) bool {
	switch c.spec.Mode {
	case BSP, Hybrid:
		return clock <= c.open
	case SSP:
		return clock-c.Slowest() <= int64(c.spec.Staleness)
	}
	return true
}

// LastIDs is each worker's last push id taken (for answers to OpInfo).
func (c *Clocks) LastIDs() []uint64 { return c.lastID }

// PushCounts is a shard's account of one worker's pushes (a worker is a
// share of the job's data: whichever process trains it).
type PushCounts struct {
	// Last is the last push id taken. A client numbers its pushes of a
	// table by step (the push of step s has id s), so Last is the share's
	// last step that reached this shard.
	Last uint64
	// Applied is how many pushes were taken (applied, aggregated or
	// stale) since Base, Duplicates how many were refused as already
	// taken. Ids only increase, so no id is taken twice; with a push
	// every step (bsp, ssp, hybrid), Applied == Last-Base means none was
	// skipped either.
	Applied, Duplicates uint64
	// Base is the clock the shard started at (a restored checkpoint's).
	Base int64
	// Again is the first push id (step) taken a second time, Skipped the
	// first one never taken below a later one taken (not under asp); 0:
	// none. They name the step that Applied only counts.
	Again, Skipped uint64
}

// Counts is worker's account.
func (c *Clocks) Counts(worker int) PushCounts {
	if worker < 0 || worker >= len(c.lastID) {
		return PushCounts{}
	}
	return PushCounts{Last: c.lastID[worker], Applied: c.applied[worker], Duplicates: c.dups[worker], Base: c.base,
		Again: c.again[worker], Skipped: c.skipped[worker]}
}

// restore starts the clocks at clock (at least), as a checkpoint left
// them: every worker at clock, nothing pushed since, and push ids (steps)
// up to clock taken.
func (c *Clocks) restore(clock int64) {
	c.open = max(c.open, clock)
	c.base = max(c.base, clock)
	for w := range c.next {
		c.next[w] = max(c.next[w], clock)
		c.lastID[w] = uint64(max(clock, 0))
		c.top[w] = c.lastID[w]
		c.applied[w], c.dups[w], c.again[w], c.skipped[w] = 0, 0, 0, 0
	}
	clear(c.pushed)
	c.npushed = 0
}
