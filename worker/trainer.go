package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/plant"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/trace"
)

// Config tunes a Trainer.
type Config struct {
	GlobalBatch  int         // samples per step across all ranks
	MicroBatches int         // gradient accumulation: each rank's share runs in this many pieces (default 1)
	LocalSteps   int         // 0 or 1: average gradients every step; K > 1: local SGD, average parameters every K steps
	ClipNorm     float64     // clip gradients to this global norm (0: off)
	CommitEvery  int         // commit the state in memory every this many steps (default 1)
	BucketBytes  int         // gradient fusion bucket size (default 1 MiB)
	Schedule     nn.Schedule // learning rate
	Seed         uint64      // sampler shuffle seed
	// When the world size changes (elastic membership), the global batch is
	// kept and each rank's share rescaled — the default. With
	// KeepRankBatch, each rank keeps GlobalBatch/ReferenceWorld samples, the
	// global batch follows the world size, and the learning rate is scaled
	// by world/ReferenceWorld (the linear scaling rule).
	KeepRankBatch  bool
	ReferenceWorld int
	// Hybrid-synchronous steps (ReduceStep, ApplyStep): what a late rank
	// does with its gradients, and the factor StaleDecay scales them by.
	Stale      Stale
	StaleDecay float64
	// Wire is the type gradients travel and are reduced in: 0 (their own,
	// float32), collective.Float16 or collective.BFloat16 (half the bytes;
	// the statistics stay exact). ErrorFeedback keeps each gradient
	// element's rounding residue for the next step (see
	// collective.FuserOptions).
	Wire          collective.DType
	ErrorFeedback bool
}

func (c *Config) validate() error {
	switch {
	case c.GlobalBatch <= 0:
		return fmt.Errorf("worker: global batch %d: want a positive number", c.GlobalBatch)
	case c.MicroBatches < 0 || c.LocalSteps < 0 || c.CommitEvery < 0 || c.BucketBytes < 0:
		return fmt.Errorf("worker: micro-batches, local steps, commit period and bucket size must not be negative")
	case c.ClipNorm < 0 || math.IsNaN(c.ClipNorm):
		return fmt.Errorf("worker: clip norm %v: must not be negative", c.ClipNorm)
	case c.Stale == StaleDecay && !(c.StaleDecay > 0 && c.StaleDecay <= 1):
		return fmt.Errorf("worker: stale gradient decay %v: want a factor in (0, 1]", c.StaleDecay)
	case c.KeepRankBatch && (c.ReferenceWorld < 1 || c.GlobalBatch < c.ReferenceWorld):
		return fmt.Errorf("worker: keeping the per-rank batch needs a reference world of 1..%d ranks, not %d", c.GlobalBatch, c.ReferenceWorld)
	}
	c.MicroBatches = max(c.MicroBatches, 1)
	c.LocalSteps = max(c.LocalSteps, 1)
	c.CommitEvery = max(c.CommitEvery, 1)
	if c.BucketBytes == 0 {
		c.BucketBytes = 1 << 20
	}
	return c.Schedule.Validate()
}

// StepStats describes one finished step; Loss and Accuracy are over the whole
// global batch, identical on every rank.
type StepStats struct {
	Step     int64 // steps done, this one included
	Samples  int   // global batch size
	Loss     float64
	Accuracy float64
	LR       float32
	GradNorm float64 // before clipping; computed only when clipping is on
	Epoch    int64
	Position Position // the sampler position after this step
	// Samples is a fingerprint of the global batch's sample indices, summed
	// over the ranks: an audit that no sample was lost or repeated.
	Fingerprint Fingerprint
	// Votes are the sums over the ranks of what each rank's voter said for
	// this step (see SetVoter).
	Votes checkpoint.Votes
	// Participated: in a hybrid-synchronous step, this rank's gradients
	// entered the update (Samples counts only the contributors' samples).
	Participated bool
	Participants int // ranks whose gradients entered the update (hybrid; 0 otherwise)
	// World and Generation are the ring's size and generation in the step:
	// the sampler split the global batch World ways, and a step reported
	// again after a ring change (Resynced.Last) is checked against them, not
	// against the new ring's.
	World      int
	Generation uint64
	// Overlapped: a hybrid step whose gradients this rank sent to be
	// reduced while its backward pass ran (see hybrid.Overlap).
	Overlapped bool
	Compute    time.Duration // this rank's model time
	Comm       time.Duration // waiting for the allreduce after the backward pass
	Total      time.Duration
}

// Fingerprint summarises a set of sample indices: their count, the sums of
// their three low bytes and of a byte-wide hash. Each sum of bytes is exact in
// float32 for up to 65,536 samples, so ranks can add their shards' fingerprints
// in the same allreduce as the loss. Two sets with equal fingerprints are
// equal but for a coincidence of five sums.
type Fingerprint [5]float64

// FingerprintOf computes the fingerprint of idx.
func FingerprintOf(idx []int) Fingerprint {
	var f Fingerprint
	for _, i := range idx {
		addFingerprint(&f, i)
	}
	return f
}

func addFingerprint(f *Fingerprint, i int) {
	u := uint32(i)
	f[0]++
	f[1] += float64(u & 0xff)
	f[2] += float64(u >> 8 & 0xff)
	f[3] += float64(u >> 16 & 0xff)
	h := u * 0x9e3779b1
	f[4] += float64(h >> 24)
}

// The statistics that travel in the step's own allreduce, after the
// gradients: the loss sum, the correct count, the fingerprint, the samples
// and ranks that contributed (hybrid steps), and the votes — so ranks agree
// on decisions (a checkpoint now, a stop) at the same step boundary for free.
const (
	statsCount = 2 + len(Fingerprint{})
	statsRanks = statsCount + 1
	statsVotes = statsRanks + 1
	statsLen   = statsVotes + len(checkpoint.Votes{})
)

// NonFiniteError is a NaN or infinite reduced gradient or loss. Every rank
// holds the same reduced values, so every rank of the ring fails the same
// step with it: a new generation would meet it again.
type NonFiniteError struct {
	Step int64 `json:"step"` // the step that produced it, counted from 1
	// Param is the first parameter (in the model's order) whose gradient
	// holds a NaN or an infinity, and Index that element; "" when every
	// gradient is finite and the loss alone is not.
	Param string `json:"param,omitempty"`
	Index int    `json:"index,omitempty"`
}

func (e *NonFiniteError) Error() string {
	if e.Param == "" {
		return fmt.Sprintf("worker: step %d: the loss is not finite", e.Step)
	}
	return fmt.Sprintf("worker: step %d: gradient of parameter %s is not finite (element %d)", e.Step, e.Param, e.Index)
}

// Deterministic says that every rank meets this error at the same step, so
// that the elastic agent ends the job rather than retrying in a new ring.
func (e *NonFiniteError) Deterministic() bool { return true }

// checkReduced fails step when its reduced gradients or loss are not
// finite: the gradients first, so that the error names the parameter even
// when the loss is NaN too. Every rank finds the same fault, and a barrier
// (bounded by the group's operation timeout) holds each one until all have:
// the first to find it would otherwise tear the ring down (its abort, its
// exit) while a peer still waited for the reduction's last bytes, and that
// peer would see a broken ring, not the fault, and train on in a new
// generation.
func (t *Trainer) checkReduced(ctx context.Context, step int64) error {
	err := checkFinite(t.params, step)
	if v := float64(t.stats[0]); err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
		err = &NonFiniteError{Step: step}
	}
	if err == nil {
		return nil
	}
	if berr := t.g.Barrier(ctx); berr != nil {
		t.log.Warn("the ranks could not agree on a non-finite step; failing it anyway", zap.Int64("step", step), zap.Error(berr))
	}
	return err
}

// PanicError is a panic in model or optimizer code, recovered.
type PanicError struct {
	Step  int64
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("worker: step %d: model code panicked: %v", e.Step, e.Value)
}

// Trainer runs data-parallel steps on one rank.
type Trainer struct {
	trace   *trace.Recorder // its steps' spans (nil: none)
	g       *collective.Group
	model   Model
	params  []*nn.Param
	data    Dataset
	opt     nn.Optimizer
	cfg     Config
	log     *zap.Logger
	sampler *Sampler
	state   *State

	fuser   *collective.Fuser[float32]
	grads   gradArena
	marked  []bool    // chunks marked ready this step
	left    []int     // parameters of each chunk not ready yet this step
	pready  []bool    // parameters ready this step
	stats   []float32 // the arena's tail: statistics travelling with the gradients (see statsLen)
	fctx    context.Context
	values  [][]float32 // parameter values, for local SGD averaging
	onReady func(int)   // the backward pass's readiness callback, built once
	idx     []int
	batch   Batch
	phase   phase
	pend    pending

	busy sync.Mutex // held by Compute
	// gate is the step being computed and whether this rank is in it
	// (gateWord): its first bucket enters it unless Withdraw took it out.
	gate         atomic.Int64
	voter        func() checkpoint.Votes
	hybridQueue  []hybridResult   // reduced hybrid steps not yet applied
	hybridFree   []*spareArena    // buffers of late steps' reductions, for reuse
	staleGrads   []float32        // StaleDecay: a late step's gradients (arena layout), scaled, for the next
	beforeUpdate func(step int64) // test hook: runs inside the update phase
	committed    StepStats        // the statistics of the last committed step
	lastBuf      []float64
}

// NewTrainer prepares a trainer; the group's world size and rank decide this
// rank's share of every batch. The context bounds the background allreduces.
func NewTrainer(ctx context.Context, g *collective.Group, m Model, data Dataset, opt nn.Optimizer, cfg Config, log *zap.Logger) (*Trainer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	sampler, err := NewSampler(data.Len(), cfg.Seed)
	if err != nil {
		return nil, err
	}
	t := &Trainer{g: g, model: m, params: m.Params(), data: data, opt: opt, cfg: cfg, log: log, sampler: sampler, fctx: ctx}
	t.state = NewState(t.params, opt)
	t.grads = newGradArena(t.params, cfg.BucketBytes, cfg.Wire.Half())
	t.stats = t.grads.tail()
	for i := len(t.params) - 1; i >= 0; i-- {
		t.values = append(t.values, t.params[i].Value)
	}
	t.marked = make([]bool, len(t.grads.chunks))
	t.left = make([]int, len(t.grads.chunks))
	t.pready = make([]bool, len(t.params))
	t.onReady = t.paramReady
	if t.fuser, err = t.newFuser(g, t.grads.chunks); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return t, nil
}

// newFuser reduces chunks of a gradient arena, each in place in a bucket of
// its own (no copy in or out; with a 16-bit wire type, each is rounded into
// its wire buffer and back). Every Fuser of the trainer is built here, with
// the same options, so every rank issues the same operations.
func (t *Trainer) newFuser(g *collective.Group, chunks [][]float32) (*collective.Fuser[float32], error) {
	o := collective.FuserOptions{BucketBytes: 1, Wire: t.cfg.Wire, ErrorFeedback: t.cfg.ErrorFeedback}
	if t.cfg.Wire.Half() {
		o.Exact = []int{len(chunks) - 1} // the statistics, in a chunk of their own
	}
	return collective.NewFuserWith(t.fctx, g, chunks, collective.Sum, o)
}

// Close stops the trainer's background allreduces.
func (t *Trainer) Close() {
	t.fuser.Close()
	t.dropSpares()
}

// Group is the collective group the trainer reduces in.
func (t *Trainer) Group() *collective.Group { return t.g }

// Rollback abandons whatever step is in progress and returns to the last
// commit, reporting how many completed steps that undoes. It is the first act
// of every rank after its group broke (a generation change); Rebind follows.
func (t *Trainer) Rollback() (redone int64, err error) {
	t.busy.Lock() // wait for a Compute still running on its own goroutine
	defer t.busy.Unlock()
	for _, r := range t.hybridQueue {
		if r.spare != nil {
			t.hybridFree = append(t.hybridFree, r.spare)
		}
	}
	t.hybridQueue = t.hybridQueue[:0]
	t.staleGrads = nil
	t.gate.Store(0) // steps are computed again
	s := t.state
	if t.phase == phaseUpdating && t.pend.updating {
		return 0, fmt.Errorf("%w: step %d's update stopped part-way with no copy of the step's start", ErrUnrecoverable, t.pend.step)
	}
	committed, ok := s.Committed()
	if !ok {
		return 0, fmt.Errorf("worker: rollback with no committed state")
	}
	redone = s.Step - committed
	if t.phase != phaseIdle || redone != 0 {
		if err := s.Restore(); err != nil {
			return 0, err
		}
	}
	t.phase = phaseIdle
	return redone, nil
}

// Rebind moves the trainer to a new group (the next generation's ring): its
// world size and rank decide the data split from the next step on. The
// trainer must be between steps (after Rollback).
func (t *Trainer) Rebind(g *collective.Group) error {
	if t.phase != phaseIdle {
		return fmt.Errorf("worker: rebind in the middle of step %d", t.pend.step)
	}
	f, err := t.newFuser(g, t.grads.chunks)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	t.fuser.Close()
	t.dropSpares()
	t.g, t.fuser = g, f
	return nil
}

// globalBatch is the step's global batch and learning-rate factor for the
// current world size.
func (t *Trainer) globalBatch() (int, float32) {
	if !t.cfg.KeepRankBatch {
		return t.cfg.GlobalBatch, 1
	}
	w := t.g.Size()
	return t.cfg.GlobalBatch / t.cfg.ReferenceWorld * w, float32(w) / float32(t.cfg.ReferenceWorld)
}

// SetVoter installs the function that gives this rank's votes for each step
// as it is finished (nil: none).
func (t *Trainer) SetVoter(f func() checkpoint.Votes) { t.voter = f }

// Restored installs a state loaded from elsewhere (a checkpoint) into the
// trainer between steps: its tensors already hold the values; step and
// position say where training stands. The state is committed.
func (t *Trainer) Restored(step int64, pos Position) error {
	if t.phase != phaseIdle {
		return fmt.Errorf("worker: restore in the middle of step %d", t.pend.step)
	}
	t.state.Step, t.state.Position = step, pos
	if plant.On(plant.ForgetMomentum) {
		_, live := t.state.Tensors()
		for _, s := range live[len(t.params):] {
			clear(s) // planted: the restore leaves the optimizer's slots at zero
		}
	}
	t.state.Commit()
	t.committed = StepStats{} // its figures were reported by the job that trained it
	return nil
}

// State is the trainer's committed and live state.
func (t *Trainer) State() *State { return t.state }

// Sampler is the trainer's sampler.
func (t *Trainer) Sampler() *Sampler { return t.sampler }

// mark launches chunk k's allreduce (once the chunks before it are
// launched): from here on the step's collective operations are under way.
func (t *Trainer) mark(k int) error {
	if t.marked[k] {
		return nil
	}
	t.marked[k] = true
	return t.fuser.MarkReady(k)
}

// paramReady is the backward pass's callback: parameter i's gradient is
// final. A chunk whose parameters are all final is reduced at once, but the
// last, which carries the statistics, waits for seal.
func (t *Trainer) paramReady(i int) {
	if i < 0 || i >= len(t.params) || t.pready[i] || t.pend.markErr != nil || t.pend.withdrawn {
		return
	}
	t.pready[i] = true
	k := t.grads.chunkOf[i]
	if t.left[k]--; t.left[k] == 0 && k < len(t.grads.chunks)-1 && t.enter() { // the last holds the statistics
		t.pend.launched = true
		t.pend.markErr = t.mark(k)
	}
}

// The states of a step's gate: open (nothing sent, nothing decided), in
// (this rank sent a bucket: its gradients are in the step's sum), out (the
// step closed without this rank: it sends nothing).
const (
	gateOpen int64 = iota
	gateIn
	gateOut
)

// gateWord packs a step and its gate's state.
func gateWord(step, state int64) int64 { return step<<2 | state }

// openGate opens the gate of step unless it was already decided (a
// Withdraw that came before the Compute began, or a recomputed step).
func (t *Trainer) openGate(step int64) {
	for {
		v := t.gate.Load()
		if v>>2 >= step || t.gate.CompareAndSwap(v, gateWord(step, gateOpen)) {
			return
		}
	}
}

// enter is called before the computed step's first bucket is sent: it
// reports whether this rank is in the step, and closes the gate to Withdraw
// if so.
func (t *Trainer) enter() bool {
	p := &t.pend
	switch {
	case p.launched || t.gate.Load() == gateWord(p.step, gateIn):
		return true
	case p.withdrawn:
		return false
	case t.gate.CompareAndSwap(gateWord(p.step, gateOpen), gateWord(p.step, gateIn)):
		return true
	}
	p.withdrawn = true
	return false
}

// Withdraw takes this rank out of a hybrid step that closed without it. It
// may run while ComputeOverlapped computes that step on another goroutine:
// it succeeds unless a bucket of the step was already sent to be reduced, in
// which case this rank's gradients are in the step's sum and it must join
// the step's reduction as a participant (ReduceStep with participate, once
// its Compute has returned). A withdrawn Compute sends nothing and finishes
// like Compute.
func (t *Trainer) Withdraw(step int64) bool {
	for {
		v := t.gate.Load()
		switch {
		case v>>2 > step || v == gateWord(step, gateOut):
			return true
		case v == gateWord(step, gateIn):
			return false
		case t.gate.CompareAndSwap(v, gateWord(step, gateOut)):
			return true
		}
	}
}

// resetMarks prepares the chunks' readiness for a step.
func (t *Trainer) resetMarks() {
	t.fuser.Reset()
	clear(t.marked)
	clear(t.pready)
	copy(t.left, t.grads.params)
}

// phase is where a trainer is in its step, so Recover knows what a failure
// may have touched.
type phase uint8

const (
	phaseIdle      phase = iota // between steps
	phaseComputing              // model code: only gradients change
	phaseComputed               // gradients ready, no collective issued
	phaseReducing               // allreduce in flight
	phaseUpdating               // optimizer writing parameters and slots
)

// pending is the step between Compute and Finish.
type pending struct {
	step    int64
	size    int
	next    Position
	sum     float64
	correct int
	start   time.Time
	compute time.Duration
	clipped bool // clipping already scaled the gradients (a retried update must not again)
	// uncopied: the update runs with no copy of the commit it starts from
	// (see update); updating: it has begun changing the live tensors.
	uncopied, updating bool
	fp                 Fingerprint
	// launched: some of the step's allreduces were issued (overlap); a
	// failure from here on has involved the other ranks.
	launched  bool
	withdrawn bool  // the step closed without this rank before it sent a bucket (Withdraw)
	sealed    bool  // statistics written and every chunk marked
	markErr   error // of a chunk launched from the backward pass
}

// Step runs one training step: every rank's share of the global batch, with
// each gradient bucket's allreduce started as soon as the backward pass has
// filled it, then clipping, the optimizer update and a commit when one is due.
func (t *Trainer) Step(ctx context.Context) (StepStats, error) {
	if err := t.compute(ctx, true); err != nil {
		return StepStats{}, err
	}
	return t.Finish(ctx)
}

// Compute runs this rank's forward and backward passes of the next step and
// issues no collective operation, so a failure in model code leaves the other
// ranks untouched: Recover, then Compute again. Finish completes the step.
func (t *Trainer) Compute(ctx context.Context) error { return t.compute(ctx, false) }

// ComputeOverlapped is Compute with each gradient bucket's allreduce started
// as soon as the backward pass has filled it, and the last (with the step's
// statistics and votes) at its end: the reductions run while the rank computes
// and waits for the step's decision; Finish waits for them. A failure in model
// code before the first bucket is sent is repaired like one in Compute; after
// it, the other ranks are part-way through the step's reductions, and Recover
// reports ErrUnrecoverable (the group must be rebuilt, as after a failure in
// Finish).
func (t *Trainer) ComputeOverlapped(ctx context.Context) error { return t.compute(ctx, true) }

// NextStep is the step Compute works on, counted from 1.
func (t *Trainer) NextStep() int64 { return t.state.Step + 1 }

func (t *Trainer) compute(ctx context.Context, overlap bool) (err error) {
	t.busy.Lock() // a hybrid rank computes on a goroutine of its own
	defer t.busy.Unlock()
	s := t.state
	p := &t.pend
	*p = pending{step: s.Step + 1, start: time.Now()}
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Step: p.step, Value: v, Stack: debug.Stack()}
		}
	}()
	t.g.Mark("forward/backward", p.step)
	t.phase = phaseComputing
	t.openGate(p.step)
	world, rank := t.g.Size(), t.g.Rank()
	global, _ := t.globalBatch()
	idx, size, next, err := t.sampler.Batch(s.Position, global, world, rank, t.idx[:0])
	if err != nil {
		return err
	}
	if plant.Enabled {
		idx = plantSamples(idx, p.step, rank)
	}
	t.idx, p.size, p.next = idx, size, next
	p.fp = FingerprintOf(idx)
	local := t.cfg.LocalSteps > 1
	scale := float32(1) / float32(size)
	if local {
		scale = float32(1) / float32(max(len(idx), 1))
	}
	clear(t.grads.grads())
	if overlap && t.staleGrads != nil { // StaleDecay: a late step's gradients join this one's before any is sent
		copy(t.grads.grads(), t.staleGrads)
		t.staleGrads = nil
	}
	t.resetMarks()
	var ready func(int)
	if overlap && !local {
		ready = t.onReady
	}
	mb := t.cfg.MicroBatches
	for m := range mb {
		lo, hi := m*len(idx)/mb, (m+1)*len(idx)/mb
		if lo == hi {
			continue
		}
		if err := t.data.Fill(idx[lo:hi], &t.batch); err != nil {
			return fmt.Errorf("worker: step %d: loading samples: %w", p.step, err)
		}
		var cb func(int)
		if hi == len(idx) {
			cb = ready
		}
		res, merr := t.model.Step(&t.batch, scale, cb)
		if merr != nil {
			return fmt.Errorf("worker: step %d: model: %w", p.step, merr)
		}
		if p.markErr != nil {
			return p.markErr
		}
		p.sum += res.LossSum
		p.correct += res.Correct
	}
	p.compute = time.Since(p.start)
	t.trace.Span(trace.ThreadStep, "forward/backward", p.start, p.start.Add(p.compute), trace.Args{Step: p.step, Rank: -1})
	t.phase = phaseComputed
	if overlap && !local {
		return t.seal()
	}
	return nil
}

// seal writes the step's statistics and votes into the arena's tail and
// launches every chunk not launched yet.
func (t *Trainer) seal() error {
	p := &t.pend
	if p.sealed {
		return nil
	}
	if t.cfg.LocalSteps > 1 {
		p.sealed = true
		t.writeStats()
		return nil
	}
	if !t.enter() {
		return nil // the step closed without this rank: nothing is sent
	}
	p.sealed = true
	t.writeStats()
	p.launched = true
	for k := range t.marked {
		if err := t.mark(k); err != nil {
			return err
		}
	}
	return nil
}

// writeStats fills the statistics tail with this rank's figures of the
// computed step.
func (t *Trainer) writeStats() {
	p, st := &t.pend, t.stats
	st[0], st[1] = float32(p.sum), float32(p.correct)
	for i, v := range p.fp {
		st[2+i] = float32(v)
	}
	st[statsCount], st[statsRanks] = float32(len(t.idx)), 1
	t.writeVotes(st)
}

// writeVotes puts this rank's votes into a statistics tail.
func (t *Trainer) writeVotes(st []float32) {
	var votes checkpoint.Votes
	if t.voter != nil {
		votes = t.voter()
	}
	copy(st[statsVotes:], votes[:])
}

// Finish reduces the gradients computed by Compute (or, in local SGD, the
// statistics), checks them, clips them, applies the optimizer and commits
// when a commit is due.
func (t *Trainer) Finish(ctx context.Context) (st StepStats, err error) {
	p := &t.pend
	if t.phase != phaseComputed {
		return st, fmt.Errorf("worker: Finish of step %d without a completed Compute", p.step)
	}
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Step: p.step, Value: v, Stack: debug.Stack()}
		}
	}()
	t.phase = phaseReducing
	t.g.Mark("reduction", p.step)
	waitFrom := time.Now()
	if err := t.seal(); err != nil {
		return st, err
	}
	if p.withdrawn {
		return st, fmt.Errorf("worker: Finish of step %d, which this rank was withdrawn from", p.step)
	}
	if t.cfg.LocalSteps > 1 {
		if err := t.g.AllReduce(ctx, collective.Float32s(t.stats), collective.Sum); err != nil {
			return st, fmt.Errorf("worker: step %d: %w", p.step, err)
		}
	} else {
		t.flushUnlessFused() // the last commit's copy, while the buckets are reduced
		if err := t.fuser.Wait(ctx); err != nil {
			return st, fmt.Errorf("worker: step %d: gradient allreduce: %w", p.step, err)
		}
	}
	st.Comm = time.Since(p.start) - p.compute
	t.trace.Span(trace.ThreadStep, "wait for the reduction", waitFrom, time.Now(), trace.Args{Step: p.step, Rank: -1})
	if err := t.checkReduced(ctx, p.step); err != nil {
		return st, err
	}
	return t.update(ctx, st)
}

// flushUnlessFused takes the last commit's copy now, unless the optimizer is
// an nn.SavingOptimizer, whose update takes it in its own pass or needs
// none (see update): copying the parameters and slots, then reading them
// again to update them, is two passes over memory they do not fit in the
// cache of.
func (t *Trainer) flushUnlessFused() {
	if _, ok := t.opt.(nn.SavingOptimizer); !ok {
		t.state.flush()
	}
}

// update applies the reduced gradients; Recover re-runs it after a failure
// part-way through.
func (t *Trainer) update(ctx context.Context, st StepStats) (StepStats, error) {
	p, s := &t.pend, t.state
	updateFrom := time.Now()
	t.g.Mark("update", p.step)
	// The last commit is the live tensors themselves while a copy is
	// pending (commitLater). How it survives the update:
	//   - uncopied: an optimizer that cannot fail part-way (an
	//     nn.SavingOptimizer), one commit a step and nothing between the
	//     update and the next commit that can fail (no local-SGD
	//     averaging): the next commit is due the moment the update ends,
	//     and nothing reads this one before. Only a panic inside the
	//     update itself would need it (Recover then reports the state
	//     unrecoverable and the ring resyncs this rank);
	//   - copied in the update's own pass (UpdateSaving);
	//   - copied first (flush), for any other optimizer.
	saving, isSaving := t.opt.(nn.SavingOptimizer)
	p.uncopied = isSaving && s.pending && t.cfg.CommitEvery == 1 && t.cfg.LocalSteps == 1
	fused := isSaving && s.pending && !p.uncopied
	if !fused && !p.uncopied {
		s.flush() // before the parameters change
	}
	t.phase = phaseUpdating
	if t.cfg.ClipNorm > 0 && !p.clipped {
		st.GradNorm = nn.ClipGlobalNorm(t.params, t.cfg.ClipNorm)
		p.clipped = true
	}
	_, lrScale := t.globalBatch()
	st.LR = t.cfg.Schedule.LR(s.Step) * lrScale
	if t.beforeUpdate != nil {
		t.beforeUpdate(p.step)
	}
	switch {
	case p.uncopied:
		p.updating = true // from here the live tensors are no commit's until the one below
		t.opt.Update(t.params, st.LR, p.step)
	case fused: // the commit's copy in the update's pass: the live tensors are the commit's until it ends
		saving.UpdateSaving(t.params, st.LR, p.step, s.saved)
		s.pending = false
	default:
		t.opt.Update(t.params, st.LR, p.step)
	}
	if plant.On(plant.ParamDrift) && p.step >= 40 && t.g.Rank() == 1 {
		v := t.params[0].Value
		v[0] = math.Nextafter32(v[0], float32(math.Inf(1))) // planted: this rank's parameters drift by one ulp
	}
	if t.cfg.LocalSteps > 1 && p.step%int64(t.cfg.LocalSteps) == 0 {
		if err := collective.AllReduceTensors(ctx, t.g, t.values, collective.Avg, t.cfg.BucketBytes); err != nil {
			return st, fmt.Errorf("worker: step %d: parameter averaging: %w", p.step, err)
		}
	}
	s.Step, s.Position = p.step, p.next
	t.phase = phaseIdle
	st.Step, st.Samples, st.Epoch, st.Position = p.step, p.size, p.next.Epoch, p.next
	st.World, st.Generation = t.g.Size(), t.g.Generation()
	for i := range st.Fingerprint {
		st.Fingerprint[i] = float64(t.stats[2+i])
	}
	copy(st.Votes[:], t.stats[statsVotes:])
	st.Loss = float64(t.stats[0]) / float64(p.size)
	st.Accuracy = float64(t.stats[1]) / float64(p.size)
	if p.step%int64(t.cfg.CommitEvery) == 0 {
		s.commitLater()
		t.committed = st
	}
	st.Compute = p.compute
	now := time.Now()
	st.Total = now.Sub(p.start)
	t.trace.Span(trace.ThreadStep, "optimizer", updateFrom, now, trace.Args{Step: p.step, Rank: -1})
	return st, nil
}

// ErrUnrecoverable is returned by Recover when a failure left state it
// cannot repair alone.
var ErrUnrecoverable = errors.New("worker: state cannot be recovered on this rank alone")

// Recover repairs the trainer after a failure (a recovered panic) inside
// Compute or Finish, from the last in-memory commit, and reports what to do
// next: true when the step's gradients are already reduced and applied again
// (the step is complete and stats hold its figures), false when the step must
// be computed again. A failure in model code touched only gradients: the
// state is restored to the commit of the step's start when there is one, and
// the step is recomputed. A failure in the optimizer update is repaired by
// restoring that commit and applying the reduced gradients again, which needs
// a commit at the step's start (CommitEvery 1). A failure while gradients
// were being reduced broke the group itself and is not recoverable here.
func (t *Trainer) Recover(ctx context.Context) (done bool, st StepStats, err error) {
	s := t.state
	committed, ok := s.Committed()
	atStart := ok && committed == t.pend.step-1 && s.Step == committed
	switch t.phase {
	case phaseIdle:
		return false, st, nil
	case phaseComputing, phaseComputed:
		if t.pend.launched {
			return false, st, fmt.Errorf("%w: step %d failed after its first gradients were sent to be reduced", ErrUnrecoverable, t.pend.step)
		}
		if atStart {
			if err := s.Restore(); err != nil {
				return false, st, err
			}
		}
		t.phase = phaseIdle
		return false, st, nil
	case phaseUpdating:
		if t.pend.updating {
			return false, st, fmt.Errorf("%w: step %d failed inside the optimizer's update, which keeps no copy of the step's start (an nn.SavingOptimizer must not fail part-way)",
				ErrUnrecoverable, t.pend.step)
		}
		if !atStart {
			return false, st, fmt.Errorf("%w: step %d failed in the optimizer update and the last commit is of step %d (commit every step to recover from this)",
				ErrUnrecoverable, t.pend.step, committed)
		}
		if err := s.Restore(); err != nil {
			return false, st, err
		}
		st, err = t.update(ctx, StepStats{})
		return err == nil, st, err
	}
	return false, st, fmt.Errorf("%w: step %d failed while its gradients were being reduced", ErrUnrecoverable, t.pend.step)
}

func checkFinite(params []*nn.Param, step int64) error {
	if allFinite(params) {
		return nil
	}
	for _, p := range params {
		for i, g := range p.Grad {
			if math.IsNaN(float64(g)) || math.IsInf(float64(g), 0) {
				return &NonFiniteError{Step: step, Param: p.Name, Index: i}
			}
		}
	}
	return nil
}

// allFinite reports whether every gradient of params is finite.
func allFinite(params []*nn.Param) bool {
	// g·0 is 0 for every finite g and NaN otherwise: one cheap pass, and the
	// slow search for the name only when something is wrong. Four
	// independent sums, so the additions do not wait on each other. (An
	// integer test of the exponent bits, element by element, measured 2.3×
	// slower: Go moves each float to an integer register.)
	var a0, a1, a2, a3 float32
	for _, p := range params {
		g := p.Grad
		i := 0
		for ; i+4 <= len(g); i += 4 {
			q := g[i : i+4 : i+4]
			a0 += q[0] * 0
			a1 += q[1] * 0
			a2 += q[2] * 0
			a3 += q[3] * 0
		}
		for ; i < len(g); i++ {
			a0 += g[i] * 0
		}
	}
	return a0+a1+a2+a3 == 0
}

// IsNonFinite reports whether err is a NonFiniteError.
func IsNonFinite(err error) bool {
	var e *NonFiniteError
	return errors.As(err, &e)
}

// SetTrace records the trainer's steps' spans in r (nil: none): forward
// and backward, the wait for the reduction, the optimizer.
func (t *Trainer) SetTrace(r *trace.Recorder) { t.trace = r }
