package collective

import (
	"sync"
	"time"
)

// OpRecord is one collective operation as this rank saw it: an entry of
// the group's hang recorder (Recent) and what an Observer is told when
// the operation ends.
type OpRecord struct {
	Op         string `json:"op"`
	Group      string `json:"group"` // the group's name (Membership.Job)
	Seq        uint64 `json:"seq"`   // the group's operation number (send/recv: that pair's)
	Generation uint64 `json:"generation"`
	Rank       int    `json:"rank"`
	World      int    `json:"world"`
	Bytes      int    `json:"bytes"`
	Algorithm  string `json:"algorithm,omitempty"` // an allreduce's
	Plane      string `json:"plane"`               // tcp, shm, hierarchical, local...
	// State is "entered" (still running, or hung), "done" or "failed".
	State string    `json:"state"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Err   string    `json:"error,omitempty"`
	// Phase and Step are what the rank was doing when it entered the
	// operation (Group.Mark): "backward" of step 912.
	Phase string `json:"phase,omitempty"`
	Step  int64  `json:"step,omitempty"`
}

// An Observer is told of every operation a group ends (metrics, trace
// timelines), on the operation's goroutine before the group is free
// again: it must return quickly, and not keep r.
type Observer interface {
	OpEnded(r *OpRecord)
}

// recorder is a group's ring buffer of its last operations.
type recorder struct {
	mu    sync.Mutex
	ops   []OpRecord
	next  int // index of the next entry
	full  bool
	phase string
	step  int64
}

func newRecorder(n int) *recorder { return &recorder{ops: make([]OpRecord, n)} }

// enter records an operation's start; it returns its slot.
func (r *recorder) enter(rec OpRecord) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.next
	rec.Phase, rec.Step = r.phase, r.step
	rec.State = "entered"
	r.ops[i] = rec
	r.next++
	if r.next == len(r.ops) {
		r.next, r.full = 0, true
	}
	return i
}

// end records the end of the operation in slot i and copies it to out.
func (r *recorder) end(i int, algo string, end time.Time, err error, out *OpRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := &r.ops[i]
	op.End = end
	if algo != "" {
		op.Algorithm = algo
	}
	if err != nil {
		op.State, op.Err = "failed", err.Error()
	} else {
		op.State = "done"
	}
	*out = *op
}

func (r *recorder) mark(phase string, step int64) {
	r.mu.Lock()
	r.phase, r.step = phase, step
	r.mu.Unlock()
}

// recent copies the entries, oldest first.
func (r *recorder) recent() []OpRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]OpRecord(nil), r.ops[:r.next]...)
	}
	return append(append([]OpRecord(nil), r.ops[r.next:]...), r.ops[:r.next]...)
}

// Recent is the group's hang recorder: its last operations (Options.Recent
// of them), oldest first, with the state of each: the one a hung or
// aborted rank is in is "entered" or "failed". Safe to call at any time,
// also while an operation hangs.
func (g *Group) Recent() []OpRecord { return g.rec.recent() }

// Mark says what this rank is doing from now on ("forward", "backward",
// "update", ...; step), recorded with every operation it enters: a hang's
// analysis says where a rank was last seen.
func (g *Group) Mark(phase string, step int64) { g.rec.mark(phase, step) }
