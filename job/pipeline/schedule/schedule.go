// Package schedule holds pipeline-parallel micro-batch schedules as pure
// functions: for a pipeline of Stages processes, a global batch of Micro
// micro-batches and (interleaved only) Chunks model chunks per stage, Build
// returns the instruction list one stage runs for one training step. Bound,
// Bubble and Simulate describe what a schedule costs: its peak of stored
// activations, its idle fraction, and a discrete-event run of every stage's
// list. Nothing here does I/O, starts goroutines or reads a clock.
//
// The kinds are GPipe (all forwards, then all backwards), 1F1B
// (PipeDream-Flush: warm-up forwards, then one forward and one backward in
// turn, then the cool-down backwards), the interleaved 1F1B of Megatron-LM
// (v chunks per stage; virtual stage k·Stages+s is chunk k of stage s), and
// ZB-H1 of Zero Bubble (backward split into B, the input gradient on the
// critical path, and W, the weight gradient, which fills the bubbles).
package schedule

import (
	"fmt"
	"strings"
)

// Kind names a schedule.
type Kind string

// The schedules.
const (
	GPipe       Kind = "gpipe"
	OneFOneB    Kind = "1f1b"
	Interleaved Kind = "interleaved"
	ZBH1        Kind = "zb-h1"
)

// Kinds lists every schedule, in the order ParseKind names them.
var Kinds = []Kind{GPipe, OneFOneB, Interleaved, ZBH1}

// ParseKind returns the Kind named s, or an error naming the valid ones.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return "", fmt.Errorf("schedule: unknown kind %q (valid: %s)", s, strings.Join(names, ", "))
}

// Op is what an instruction does.
type Op uint8

// The operations of a stage.
const (
	// Load loads a micro-batch: its inputs on the chunk holding the first
	// virtual stage, its labels on the chunk holding the last (one Load
	// when both are the same chunk).
	Load Op = iota
	// Forward runs a chunk's forward pass on a micro-batch.
	Forward
	// Backward runs a chunk's whole backward pass (input and weight
	// gradients).
	Backward
	// BackwardInput (B) computes the gradient of the chunk's input only.
	BackwardInput
	// BackwardWeight (W) computes the gradient of the chunk's weights.
	BackwardWeight
	// SendAct sends a forward's output to the next virtual stage.
	SendAct
	// RecvAct receives a forward's input from the previous virtual stage.
	RecvAct
	// SendGrad sends an input gradient to the previous virtual stage.
	SendGrad
	// RecvGrad receives an output gradient from the next virtual stage.
	RecvGrad
	// Reduce is the stage's data-parallel gradient reduction, once per
	// step after its last backward.
	Reduce
	// OptimizerStep applies the reduced gradients, once per step.
	OptimizerStep
)

var opNames = [...]string{"Load", "F", "BW", "B", "W", "SendAct", "RecvAct", "SendGrad", "RecvGrad", "Reduce", "OptimizerStep"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", o)
}

// compute reports whether o is a computation (has a cost in Simulate).
func (o Op) compute() bool {
	return o == Forward || o == Backward || o == BackwardInput || o == BackwardWeight
}

// Instr is one instruction of a stage.
type Instr struct {
	Op    Op
	Micro int // the micro-batch, -1 for Reduce and OptimizerStep
	Chunk int // the stage's local model chunk, 0..Chunks-1
	Peer  int // the stage sent to or received from, -1 when none
}

func (in Instr) String() string {
	switch in.Op {
	case Reduce, OptimizerStep:
		return in.Op.String()
	}
	s := fmt.Sprintf("%v(m%d", in.Op, in.Micro)
	if in.Chunk != 0 {
		s += fmt.Sprintf(",c%d", in.Chunk)
	}
	if in.Peer >= 0 {
		s += fmt.Sprintf(",p%d", in.Peer)
	}
	return s + ")"
}

// Config is a pipeline's shape.
type Config struct {
	Kind   Kind
	Stages int // P, the pipeline's processes
	Micro  int // m, the micro-batches of a step
	Chunks int // v, model chunks per stage: ≥ 2 for Interleaved; 1 (or 0, read as 1) otherwise
}

func (c Config) chunks() int {
	if c.Chunks == 0 && c.Kind != Interleaved {
		return 1
	}
	return c.Chunks
}

// Validate reports the first thing wrong with c, naming the field and value.
func (c Config) Validate() error {
	if _, err := ParseKind(string(c.Kind)); err != nil {
		return fmt.Errorf("schedule: Kind: %w", err)
	}
	if c.Stages < 1 {
		return fmt.Errorf("schedule: Stages = %d, want ≥ 1", c.Stages)
	}
	if c.Micro < 1 {
		return fmt.Errorf("schedule: Micro = %d, want ≥ 1", c.Micro)
	}
	if c.Kind == Interleaved {
		if c.Chunks < 2 {
			return fmt.Errorf("schedule: Chunks = %d, want ≥ 2 for %s", c.Chunks, c.Kind)
		}
		if c.Micro%c.Stages != 0 {
			return fmt.Errorf("schedule: Micro = %d, want a multiple of Stages = %d for %s", c.Micro, c.Stages, c.Kind)
		}
	} else if c.chunks() != 1 {
		return fmt.Errorf("schedule: Chunks = %d, want 1 for %s", c.Chunks, c.Kind)
	}
	return nil
}

func (c Config) check(stage int) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if stage < 0 || stage >= c.Stages {
		return fmt.Errorf("schedule: stage %d out of range [0, %d)", stage, c.Stages)
	}
	return nil
}

// emitter appends a stage's instructions with their loads and transfers.
type emitter struct {
	p, v, s int
	out     []Instr
}

func (e *emitter) add(op Op, micro, chunk, peer int) {
	e.out = append(e.out, Instr{Op: op, Micro: micro, Chunk: chunk, Peer: peer})
}

// forward emits chunk k's forward of micro i: receive, load, compute, send.
func (e *emitter) forward(i, k int) {
	j := k*e.p + e.s
	last := e.p*e.v - 1
	if j > 0 && e.p > 1 {
		e.add(RecvAct, i, k, (e.s+e.p-1)%e.p)
	}
	if j == 0 || j == last {
		e.add(Load, i, k, -1)
	}
	e.add(Forward, i, k, -1)
	if j < last && e.p > 1 {
		e.add(SendAct, i, k, (e.s+1)%e.p)
	}
}

// backward emits chunk k's backward (op Backward or BackwardInput) of micro
// i: receive the gradient, compute, send.
func (e *emitter) backward(op Op, i, k int) {
	j := k*e.p + e.s
	if j < e.p*e.v-1 && e.p > 1 {
		e.add(RecvGrad, i, k, (e.s+1)%e.p)
	}
	e.add(op, i, k, -1)
	if j > 0 && e.p > 1 {
		e.add(SendGrad, i, k, (e.s+e.p-1)%e.p)
	}
}

func (e *emitter) finish() []Instr {
	e.add(Reduce, -1, 0, -1)
	e.add(OptimizerStep, -1, 0, -1)
	return e.out
}

// Build returns the instructions stage runs for one training step.
func Build(c Config, stage int) ([]Instr, error) {
	if err := c.check(stage); err != nil {
		return nil, err
	}
	e := &emitter{p: c.Stages, v: c.chunks(), s: stage}
	m := c.Micro
	switch c.Kind {
	case GPipe:
		for i := 0; i < m; i++ {
			e.forward(i, 0)
		}
		for i := 0; i < m; i++ {
			e.backward(Backward, i, 0)
		}
	case OneFOneB:
		w := min(c.Stages-1-stage, m)
		for i := 0; i < w; i++ {
			e.forward(i, 0)
		}
		for i := 0; i < m-w; i++ {
			e.forward(w+i, 0)
			e.backward(Backward, i, 0)
		}
		for i := m - w; i < m; i++ {
			e.backward(Backward, i, 0)
		}
	case Interleaved:
		p, v := c.Stages, c.Chunks
		total := m * v
		fwd := func(n int) (micro, chunk int) { return (n/(p*v))*p + n%p, (n / p) % v }
		w := min((p-1-stage)*2+(v-1)*p, total)
		for n := 0; n < w; n++ {
			e.forward(fwd(n))
		}
		for n := 0; n < total-w; n++ {
			e.forward(fwd(w + n))
			i, k := fwd(n)
			e.backward(Backward, i, v-1-k)
		}
		for n := total - w; n < total; n++ {
			i, k := fwd(n)
			e.backward(Backward, i, v-1-k)
		}
	case ZBH1:
		return zbh1(c.Stages, m)[stage], nil
	}
	return e.finish(), nil
}

// zbh1 builds every stage's ZB-H1 list by list scheduling in unit time
// (F = B = W = 1): at each step a stage runs B if its next backward's
// gradient has come; else W if P Ws are pending (so a stage keeps the
// weight-gradient inputs of at most P micro-batches); else F if its next
// forward's input has come and fewer than min(P−s, m) micro-batches are
// between F and B (1F1B's memory); else W if one is pending; otherwise it
// waits. W thus fills what would be 1F1B's bubbles, and B, alone on the
// critical path, makes the backward chain shorter.
func zbh1(p, m int) [][]Instr {
	const never = int(^uint(0) >> 1)
	es := make([]*emitter, p)
	actAt := make([][]int, p)  // when stage s has micro i's input
	gradAt := make([][]int, p) // when stage s has micro i's output gradient
	nf, nb, nw := make([]int, p), make([]int, p), make([]int, p)
	for s := range p {
		es[s] = &emitter{p: p, v: 1, s: s}
		actAt[s] = make([]int, m)
		gradAt[s] = make([]int, m)
		for i := range m {
			actAt[s][i], gradAt[s][i] = never, never
			if s == 0 {
				actAt[s][i] = 0
			}
			if s == p-1 {
				gradAt[s][i] = 0
			}
		}
	}
	for t, done := 0, 0; done < p; t++ {
		done = 0
		for s := range p {
			e := es[s]
			switch {
			case nb[s] < nf[s] && gradAt[s][nb[s]] <= t:
				i := nb[s]
				e.backward(BackwardInput, i, 0)
				if s > 0 {
					gradAt[s-1][i] = t + 1
				}
				nb[s]++
			case nb[s]-nw[s] >= p:
				e.add(BackwardWeight, nw[s], 0, -1)
				nw[s]++
			case nf[s] < m && actAt[s][nf[s]] <= t && nf[s]-nb[s] < min(p-s, m):
				i := nf[s]
				e.forward(i, 0)
				if s < p-1 {
					actAt[s+1][i] = t + 1
				}
				nf[s]++
			case nw[s] < nb[s]:
				e.add(BackwardWeight, nw[s], 0, -1)
				nw[s]++
			case nw[s] == m:
				done++
			}
		}
	}
	out := make([][]Instr, p)
	for s := range p {
		out[s] = es[s].finish()
	}
	return out
}

// Bound is the most micro-batch activations (summed over chunks) stage
// holds at once under c's schedule, counting a forward's activations from
// the forward until its backward (until B under ZB-H1):
//
//   - GPipe: Micro, every forward precedes every backward;
//   - 1F1B and ZB-H1: min(Stages − stage, Micro), the warm-up forwards and
//     one more;
//   - interleaved: min(2·(Stages − stage − 1) + (Chunks − 1)·Stages + 1,
//     Micro·Chunks), Megatron's warm-up forwards and one more.
//
// It returns 0 for an invalid config or stage.
func Bound(c Config, stage int) int {
	if c.check(stage) != nil {
		return 0
	}
	p, m := c.Stages, c.Micro
	switch c.Kind {
	case GPipe:
		return m
	case Interleaved:
		return min(2*(p-stage-1)+(c.Chunks-1)*p+1, m*c.Chunks)
	}
	return min(p-stage, m)
}

// Bubble is the idle fraction of a stage's time under c's schedule with
// unit costs (F = 1, backward = 2, or B = 1 and W = 1 when split; a chunk
// of an interleaved stage costs 1/v of that):
//
//   - GPipe and 1F1B: (P−1)/(m+P−1);
//   - interleaved: (P−1)/(v·m+P−1);
//   - ZB-H1: the idle fraction of Simulate with unit costs. When m ≥ P it
//     is exactly (P−1)/(3m+P−1): the makespan is 3m+P−1 against 3m of
//     work, as the first input reaches stage P−1 after P−1 steps and, B
//     alone being on the backward chain, the deferred Ws fill the other
//     waits (the tests check this for P ≤ 8, m ≤ 16). When m < P the
//     warm-up cannot fill the pipe and it is higher (P=4, m=2: 5/11; 1F1B
//     has 3/5).
//
// It returns NaN for an invalid config.
func Bubble(c Config) float64 {
	if c.Validate() != nil {
		return nan()
	}
	p, m := float64(c.Stages), float64(c.Micro)
	switch c.Kind {
	case Interleaved:
		return (p - 1) / (float64(c.Chunks)*m + p - 1)
	case ZBH1:
		sim, err := Simulate(c, Cost{F: 1, B: 1, W: 1})
		if err != nil {
			return nan()
		}
		return sim.Idle
	}
	return (p - 1) / (m + p - 1)
}

func nan() float64 {
	var z float64
	return z / z
}
