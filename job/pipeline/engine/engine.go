// Package engine runs one pipeline stage's schedule: the instruction list
// of package schedule, executed over the stage's model chunks (nn.Stage)
// and its links to the neighbouring stages. Activations and gradients
// travel as raw float32 tensors; each incoming link has a goroutine that
// receives the schedule's next tensor ahead of need into a buffer of a
// pool sized from the schedule, so communication overlaps computation and
// a step in steady state allocates nothing. The loss (softmax
// cross-entropy) is computed on the last virtual stage, from labels the
// stage loads itself.
package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/phalanx-rt/phalanx/job/pipeline/schedule"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/trace"
)

// Sender sends tensors, in order, to one peer stage.
type Sender interface {
	Send(ctx context.Context, data []float32) error
}

// Receiver receives tensors, in the order sent, from one peer stage: a
// tensor of another length than data's is an error, never a silent
// misread.
type Receiver interface {
	Recv(ctx context.Context, data []float32) error
}

// Links are a stage's links, indexed by peer stage (nil where the schedule
// has no traffic): activations flow to the next virtual stage, gradients
// back to the previous one.
type Links struct {
	ActOut, GradOut []Sender
	ActIn, GradIn   []Receiver
}

// Chunk is one model chunk of the stage (one, except under the
// interleaved schedule) and its input and output widths.
type Chunk struct {
	Stage   *nn.Stage
	In, Out int
}

// Data gives the stage its micro-batches of the current step: their
// sizes on every stage, the first virtual stage's inputs, the last one's
// labels. It does not change during a step.
type Data interface {
	// Rows is micro-batch micro's number of samples, at most Config.Rows
	// (an epoch's last step may be short).
	Rows(micro int) int
	// Scale multiplies the loss's gradient: 1 / the samples of the step
	// across every replica, so that summed gradients are the global mean.
	Scale() float32
	// Inputs fills x (Rows(micro) × the first chunk's In) with micro-batch
	// micro's inputs.
	Inputs(micro int, x []float32) error
	// Labels are micro-batch micro's Rows(micro) labels, valid for the
	// step.
	Labels(micro int) []int32
}

// Config is one stage of a pipeline.
type Config struct {
	Schedule schedule.Config
	Stage    int
	Chunks   []Chunk // Schedule.Chunks of them (1 unless interleaved)
	Rows     int     // the most samples of a micro-batch (its buffers' size)
	Links    Links
	Data     Data
	// Ready, when set, is called with chunk k's parameter index (in
	// Stage.Params order) as soon as its gradient for the step is
	// complete, so its data-parallel reduction overlaps the backward
	// passes still to run.
	Ready func(chunk, param int)
	// Reduce and Update run the schedule's Reduce and OptimizerStep
	// instructions (nil: nothing). Reduce is given the step's stats so
	// far: every forward and backward has run, so the loss is complete.
	Reduce func(ctx context.Context, s *Stats) error
	Update func(ctx context.Context) error
	Now    func() time.Time // nil: time.Now
	// Trace records each instruction as a span (nil: none).
	Trace *trace.Recorder
}

// Stats are one step's measurements on this stage.
type Stats struct {
	Elapsed time.Duration // from the step's start to its optimizer step
	Busy    time.Duration // computing (forward and backward passes)
	// Sched is the schedule's part of the step: from its start to the
	// gradient reduction (the data loaded, every forward and backward).
	Sched time.Duration
	// Wait is the part of Sched spent waiting for a peer's tensor (the
	// receiver had not taken it yet), Send the part spent handing the
	// stage's own to the data plane: with Busy, where a bubble beyond the
	// formula went.
	Wait, Send time.Duration
	// Peak is the most micro-batches whose activations the stage held
	// at once (forward done, backward or B not), summed over chunks.
	Peak int
	// LossSum and Correct are the last virtual stage's summed loss and
	// right answers over its micro-batches (zero elsewhere).
	LossSum float64
	Correct int
}

// Bubble is the schedule's idle fraction, 1 − Busy/Sched: what the
// schedule's formula predicts (the reduction across replicas and the
// optimizer step after it are not the pipeline's bubble).
func (s Stats) Bubble() float64 {
	if s.Sched <= 0 {
		return 0
	}
	return 1 - float64(s.Busy)/float64(s.Sched)
}

// ShapeError is a malformed tensor from a peer, or a configuration that
// does not fit: the step cannot go on.
type ShapeError struct{ Detail string }

func (e *ShapeError) Error() string { return "pipeline: " + e.Detail }

// key is a micro-batch of a chunk.
type key struct{ micro, chunk int }

// arrival is a received tensor (or why none came).
type arrival struct {
	buf []float32
	err error
}

// inbound is one incoming link's receiving goroutine: it receives the
// step's tensors in schedule order into buffers of their chunk's pool.
type inbound struct {
	r      Receiver
	expect []key // a step's tensors, in order
	infer  []key // an inference's tensors, in order
	pools  []chan []float32
	width  []int // per chunk: a row's values
	start  chan plan
	out    chan arrival
}

// plan is what an inbound link receives next: keys' tensors, sized by
// data, under ctx.
type plan struct {
	ctx  context.Context
	keys []key
	data Data
}

func (in *inbound) run(quit <-chan struct{}) {
	for {
		var pl plan
		select {
		case pl = <-in.start:
		case <-quit:
			return
		}
		ctx := pl.ctx
		for _, k := range pl.keys {
			var buf []float32
			select {
			case buf = <-in.pools[k.chunk]:
			case <-ctx.Done():
				in.out <- arrival{err: context.Cause(ctx)}
				return
			case <-quit:
				return
			}
			n := pl.data.Rows(k.micro) * in.width[k.chunk]
			if n > cap(buf) {
				in.out <- arrival{buf: buf, err: &ShapeError{fmt.Sprintf("micro-batch %d of %d rows outgrows its buffer of %d values", k.micro, pl.data.Rows(k.micro), cap(buf))}}
				return
			}
			if err := in.r.Recv(ctx, buf[:n]); err != nil {
				in.out <- arrival{buf: buf, err: err}
				return // the engine is broken: no more steps
			}
			in.out <- arrival{buf: buf}
		}
	}
}

// Engine runs a stage's steps. It is driven by one goroutine.
type Engine struct {
	cfg    Config
	list   []schedule.Instr
	names  []string // each instruction's, for the trace (made once)
	steps  int64    // steps run
	last   []int    // per chunk: list index of its final backward op (Backward, or W)
	first  bool     // chunk 0 is virtual stage 0
	lastVS bool     // chunk Chunks-1 is the last virtual stage
	now    func() time.Time

	actPool, gradPool []chan []float32 // per chunk
	actIn, gradIn     []*inbound       // per peer stage
	in, dy            [][][]float32    // per chunk, per micro: the input and the received output gradient
	out, dx           [][][]float32    // per chunk, per micro: the chunk's output and input gradient, to send
	ready             []func(int)      // per chunk: Config.Ready bound to it
	slot              [][]int          // per chunk, per micro: its nn.Stage slot
	free              [][]int          // per chunk: free slots
	labels            [][]int32        // per micro
	loss              []nn.SoftmaxCrossEntropy
	lossGrad          []nn.Matrix // per micro: the loss's gradient
	lossSlot          []int       // per micro: the loss buffer it uses
	freeLoss          []int
	quit              chan struct{}
	broken            error
	st                Stats // the running step's, kept here so Reduce's pointer does not escape per step
}

// New checks cfg against its schedule and prepares the stage's buffers
// and receiving goroutines; Close stops them.
func New(cfg Config) (*Engine, error) {
	sc := cfg.Schedule
	list, err := schedule.Build(sc, cfg.Stage)
	if err != nil {
		return nil, err
	}
	v := max(sc.Chunks, 1)
	switch {
	case len(cfg.Chunks) != v:
		return nil, &ShapeError{fmt.Sprintf("%d model chunks on stage %d, schedule %s wants %d", len(cfg.Chunks), cfg.Stage, sc.Kind, v)}
	case cfg.Rows < 1:
		return nil, &ShapeError{fmt.Sprintf("%d rows per micro-batch, want at least 1", cfg.Rows)}
	case cfg.Data == nil:
		return nil, errors.New("pipeline: engine without data")
	}
	for k, c := range cfg.Chunks {
		if c.Stage == nil || c.In < 1 || c.Out < 1 {
			return nil, &ShapeError{fmt.Sprintf("stage %d chunk %d: no layers or widths %d→%d", cfg.Stage, k, c.In, c.Out)}
		}
	}
	p, m := sc.Stages, sc.Micro
	e := &Engine{cfg: cfg, list: list, now: cfg.Now, quit: make(chan struct{}),
		first: cfg.Stage == 0, lastVS: cfg.Stage == p-1,
		actIn: make([]*inbound, p), gradIn: make([]*inbound, p)}
	if e.now == nil {
		e.now = time.Now
	}
	e.last = make([]int, v)
	if cfg.Trace != nil {
		e.names = make([]string, len(list))
		for i, in := range list {
			e.names[i] = in.String()
		}
	}
	for i, in := range list {
		if in.Op == schedule.Backward || in.Op == schedule.BackwardWeight {
			e.last[in.Chunk] = i
		}
	}
	acts, grads, lossBufs := peaks(list, v, e.first, e.lastVS)
	e.actPool, e.gradPool = make([]chan []float32, v), make([]chan []float32, v)
	e.in, e.dy, e.slot, e.free = make([][][]float32, v), make([][][]float32, v), make([][]int, v), make([][]int, v)
	e.out, e.dx, e.ready = make([][][]float32, v), make([][][]float32, v), make([]func(int), v)
	for k, c := range cfg.Chunks {
		e.out[k], e.dx[k] = make([][]float32, m), make([][]float32, m)
		if cfg.Ready != nil {
			e.ready[k] = func(p int) { cfg.Ready(k, p) }
		}
		e.actPool[k] = pool(acts[k]+1, cfg.Rows*c.In)
		e.gradPool[k] = pool(grads[k]+1, cfg.Rows*c.Out)
		e.in[k], e.dy[k], e.slot[k] = make([][]float32, m), make([][]float32, m), make([]int, m)
		for s := acts[k] + 1; s > 0; s-- {
			e.free[k] = append(e.free[k], s-1)
		}
	}
	if e.lastVS {
		e.loss = make([]nn.SoftmaxCrossEntropy, lossBufs)
		e.lossGrad, e.lossSlot = make([]nn.Matrix, m), make([]int, m)
		for s := lossBufs; s > 0; s-- {
			e.freeLoss = append(e.freeLoss, s-1)
		}
	}
	if e.first || e.lastVS {
		e.labels = make([][]int32, m)
	}
	if err := e.wire(p); err != nil {
		return nil, err
	}
	return e, nil
}

func pool(n, size int) chan []float32 {
	c := make(chan []float32, n)
	for range n {
		c <- make([]float32, size)
	}
	return c
}

// peaks walks the list and returns, per chunk, the most input and
// gradient buffers held at once (an input from its receive or load to its
// chunk's final backward op, a gradient from its receive to the same), and
// the most loss gradients the last virtual stage holds.
func peaks(list []schedule.Instr, v int, first, lastVS bool) (acts, grads []int, loss int) {
	acts, grads = make([]int, v), make([]int, v)
	a, g := make([]int, v), make([]int, v)
	var l int
	for _, in := range list {
		k := in.Chunk
		switch in.Op {
		case schedule.RecvAct:
			a[k]++
		case schedule.Load:
			if k == 0 && first {
				a[k]++
			}
		case schedule.RecvGrad:
			g[k]++
		case schedule.Forward:
			if k == v-1 && lastVS {
				l++
				loss = max(loss, l)
			}
		case schedule.Backward, schedule.BackwardWeight:
			a[k]--
			if k == v-1 && lastVS {
				l--
			} else {
				g[k]--
			}
		}
		acts[k], grads[k] = max(acts[k], a[k]), max(grads[k], g[k])
	}
	return acts, grads, loss
}

// wire starts a receiving goroutine per incoming link, with the tensors
// it receives each step in schedule order.
func (e *Engine) wire(p int) error {
	l := e.cfg.Links
	ins, outs := make([]int, len(e.cfg.Chunks)), make([]int, len(e.cfg.Chunks))
	for k, c := range e.cfg.Chunks {
		ins[k], outs[k] = c.In, c.Out
	}
	mk := func(rs []Receiver, peer int, what string, pools []chan []float32) (*inbound, error) {
		if peer >= len(rs) || rs[peer] == nil {
			return nil, fmt.Errorf("pipeline: stage %d has no %s link from stage %d", e.cfg.Stage, what, peer)
		}
		w := ins
		if what == "gradient" {
			w = outs
		}
		return &inbound{r: rs[peer], pools: pools, width: w, start: make(chan plan, 1)}, nil
	}
	for _, in := range e.list {
		var err error
		switch in.Op {
		case schedule.RecvAct:
			if e.actIn[in.Peer] == nil {
				e.actIn[in.Peer], err = mk(l.ActIn, in.Peer, "activation", e.actPool)
			}
			if err == nil {
				e.actIn[in.Peer].expect = append(e.actIn[in.Peer].expect, key{in.Micro, in.Chunk})
			}
		case schedule.RecvGrad:
			if e.gradIn[in.Peer] == nil {
				e.gradIn[in.Peer], err = mk(l.GradIn, in.Peer, "gradient", e.gradPool)
			}
			if err == nil {
				e.gradIn[in.Peer].expect = append(e.gradIn[in.Peer].expect, key{in.Micro, in.Chunk})
			}
		case schedule.SendAct:
			if in.Peer >= len(l.ActOut) || l.ActOut[in.Peer] == nil {
				err = fmt.Errorf("pipeline: stage %d has no activation link to stage %d", e.cfg.Stage, in.Peer)
			}
		case schedule.SendGrad:
			if in.Peer >= len(l.GradOut) || l.GradOut[in.Peer] == nil {
				err = fmt.Errorf("pipeline: stage %d has no gradient link to stage %d", e.cfg.Stage, in.Peer)
			}
		}
		if err != nil {
			return err
		}
	}
	for _, ib := range append(append([]*inbound(nil), e.actIn...), e.gradIn...) {
		if ib != nil {
			ib.out = make(chan arrival, len(ib.expect))
			go ib.run(e.quit)
		}
	}
	// An inference's forwards come in (micro-batch, chunk) order from the
	// previous virtual stage.
	if prev := (e.cfg.Stage + p - 1) % p; p > 1 && e.actIn[prev] != nil {
		for k := range e.cfg.Chunks {
			if k*p+e.cfg.Stage > 0 {
				e.actIn[prev].infer = append(e.actIn[prev].infer, key{0, k})
			}
		}
	}
	return nil
}

// Close stops the receiving goroutines. A goroutine blocked in a receive
// ends when its link is closed or its step's context ends.
func (e *Engine) Close() {
	close(e.quit)
}

// Chunks are the stage's model chunks.
func (e *Engine) Chunks() []Chunk { return e.cfg.Chunks }

// Peak is the most micro-batches the schedule keeps in flight on this
// stage (schedule.Bound).
func (e *Engine) Peak() int { return schedule.Bound(e.cfg.Schedule, e.cfg.Stage) }

// BufferBytes are the bytes of the engine's receive and loss buffers.
func (e *Engine) BufferBytes() int64 {
	var n int64
	for k, c := range e.cfg.Chunks {
		n += int64(cap(e.actPool[k])*e.cfg.Rows*c.In+cap(e.gradPool[k])*e.cfg.Rows*c.Out) * 4
	}
	if e.lastVS {
		n += int64(len(e.loss)*e.cfg.Rows*e.cfg.Chunks[len(e.cfg.Chunks)-1].Out) * 4
	}
	return n
}

// Step runs one training step: the stage's whole instruction list. After
// an error the engine is broken (its links are out of step with the
// peers'): every later Step returns the same error.
func (e *Engine) Step(ctx context.Context) (Stats, error) {
	if e.broken != nil {
		return Stats{}, e.broken
	}
	e.st = Stats{}
	st := &e.st
	t0 := e.now()
	for _, ib := range e.actIn {
		if ib != nil {
			ib.start <- plan{ctx, ib.expect, e.cfg.Data}
		}
	}
	for _, ib := range e.gradIn {
		if ib != nil {
			ib.start <- plan{ctx, ib.expect, e.cfg.Data}
		}
	}
	inFlight := 0
	e.steps++
	for pos, in := range e.list {
		var err error
		var began time.Time
		if e.cfg.Trace != nil {
			began = e.now()
		}
		switch in.Op {
		case schedule.Load:
			err = e.load(in)
		case schedule.RecvAct:
			t := e.now()
			err = e.receive(e.actIn[in.Peer], in, e.in)
			st.Wait += e.now().Sub(t)
		case schedule.RecvGrad:
			t := e.now()
			err = e.receive(e.gradIn[in.Peer], in, e.dy)
			st.Wait += e.now().Sub(t)
		case schedule.Forward:
			t := e.now()
			err = e.forward(in, st)
			st.Busy += e.now().Sub(t)
			inFlight++
			st.Peak = max(st.Peak, inFlight)
		case schedule.Backward, schedule.BackwardInput, schedule.BackwardWeight:
			t := e.now()
			err = e.backward(in, pos)
			st.Busy += e.now().Sub(t)
			if in.Op != schedule.BackwardWeight {
				inFlight--
			}
		case schedule.SendAct:
			t := e.now()
			err = e.cfg.Links.ActOut[in.Peer].Send(ctx, e.out[in.Chunk][in.Micro])
			st.Send += e.now().Sub(t)
		case schedule.SendGrad:
			t := e.now()
			err = e.cfg.Links.GradOut[in.Peer].Send(ctx, e.dx[in.Chunk][in.Micro])
			st.Send += e.now().Sub(t)
		case schedule.Reduce:
			st.Sched = e.now().Sub(t0)
			if e.cfg.Reduce != nil {
				err = e.cfg.Reduce(ctx, st)
			}
		case schedule.OptimizerStep:
			if e.cfg.Update != nil {
				err = e.cfg.Update(ctx)
			}
		}
		if e.cfg.Trace != nil {
			e.cfg.Trace.Span(trace.ThreadPipeline, e.names[pos], began, e.now(), trace.Args{Step: e.steps, Rank: -1})
		}
		if err != nil {
			e.broken = fmt.Errorf("pipeline stage %d, %v: %w", e.cfg.Stage, in, err)
			return *st, e.broken
		}
	}
	st.Elapsed = e.now().Sub(t0)
	return *st, nil
}

func (e *Engine) load(in schedule.Instr) error {
	if rows := e.cfg.Data.Rows(in.Micro); rows > e.cfg.Rows || rows < 0 {
		return &ShapeError{fmt.Sprintf("micro-batch %d of %d rows, the stage's buffers hold %d", in.Micro, rows, e.cfg.Rows)}
	}
	if in.Chunk == 0 && e.first {
		buf := <-e.actPool[0] // the pool holds one more than the schedule's peak
		if err := e.cfg.Data.Inputs(in.Micro, buf[:e.cfg.Data.Rows(in.Micro)*e.cfg.Chunks[0].In]); err != nil {
			return err
		}
		e.in[0][in.Micro] = buf
	}
	if in.Chunk == len(e.cfg.Chunks)-1 && e.lastVS {
		l := e.cfg.Data.Labels(in.Micro)
		if rows := e.cfg.Data.Rows(in.Micro); len(l) != rows {
			return &ShapeError{fmt.Sprintf("%d labels for micro-batch %d of %d rows", len(l), in.Micro, rows)}
		}
		e.labels[in.Micro] = l
	}
	return nil
}

func (e *Engine) receive(ib *inbound, in schedule.Instr, into [][][]float32) error {
	a := <-ib.out
	if a.err != nil {
		return a.err
	}
	into[in.Chunk][in.Micro] = a.buf
	return nil
}

// forward runs chunk k's forward of a micro-batch into a free slot; on the
// last virtual stage it also computes the loss and its gradient.
func (e *Engine) forward(in schedule.Instr, st *Stats) error {
	k, i := in.Chunk, in.Micro
	c := e.cfg.Chunks[k]
	f := &e.free[k]
	s := (*f)[len(*f)-1]
	*f = (*f)[:len(*f)-1]
	e.slot[k][i] = s
	rows := e.cfg.Data.Rows(i)
	y := c.Stage.Forward(s, nn.Matrix{Rows: rows, Cols: c.In, Data: e.in[k][i][:rows*c.In]})
	if c.Stage.Recomputes() { // the stage kept its own copy of the input
		e.actPool[k] <- e.in[k][i]
		e.in[k][i] = nil
	}
	if y.Rows != rows || y.Cols != c.Out {
		return &ShapeError{fmt.Sprintf("chunk %d gives %d×%d outputs, the pipeline expects %d×%d", k, y.Rows, y.Cols, rows, c.Out)}
	}
	e.out[k][i] = y.Data
	if k != len(e.cfg.Chunks)-1 || !e.lastVS {
		return nil
	}
	fl := &e.freeLoss
	ls := (*fl)[len(*fl)-1]
	*fl = (*fl)[:len(*fl)-1]
	e.lossSlot[i] = ls
	sum, correct, grad, err := e.loss[ls].Loss(y, e.labels[i], e.cfg.Data.Scale())
	if err != nil {
		return err
	}
	st.LossSum += sum
	st.Correct += correct
	e.lossGrad[i] = grad
	return nil
}

// backward runs one backward op of chunk k; its chunk's final backward
// op of the step reports the parameters ready, and the micro-batch's last
// backward op frees its slot and buffers.
func (e *Engine) backward(in schedule.Instr, pos int) error {
	k, i := in.Chunk, in.Micro
	c := e.cfg.Chunks[k]
	var ready func(int)
	if pos == e.last[k] {
		ready = e.ready[k]
	}
	s := e.slot[k][i]
	var dy nn.Matrix
	if in.Op != schedule.BackwardWeight {
		dy = e.gradFor(k, i)
	}
	switch in.Op {
	case schedule.Backward:
		e.dx[k][i] = c.Stage.Backward(s, dy, ready).Data
	case schedule.BackwardInput:
		e.dx[k][i] = c.Stage.BackwardInput(s, dy).Data
		return nil
	case schedule.BackwardWeight:
		c.Stage.BackwardWeight(s, ready)
	}
	e.free[k] = append(e.free[k], s)
	if buf := e.in[k][i]; buf != nil {
		e.actPool[k] <- buf
		e.in[k][i] = nil
	}
	if k == len(e.cfg.Chunks)-1 && e.lastVS {
		e.freeLoss = append(e.freeLoss, e.lossSlot[i])
	} else {
		e.gradPool[k] <- e.dy[k][i]
		e.dy[k][i] = nil
	}
	return nil
}

func (e *Engine) gradFor(k, i int) nn.Matrix {
	if k == len(e.cfg.Chunks)-1 && e.lastVS {
		return e.lossGrad[i]
	}
	rows, out := e.cfg.Data.Rows(i), e.cfg.Chunks[k].Out
	return nn.Matrix{Rows: rows, Cols: out, Data: e.dy[k][i][:rows*out]}
}

// Infer runs forward passes only, one micro-batch at a time through the
// pipeline, over data's micro-batches 0..n-1 (Rows(i) ≤ Config.Rows each),
// and returns the last virtual stage's summed loss and right answers (zero
// elsewhere). Every stage of the pipeline calls it with the same n.
func (e *Engine) Infer(ctx context.Context, data Data, n int) (loss float64, correct int, err error) {
	if e.broken != nil {
		return 0, 0, e.broken
	}
	p, s, v := e.cfg.Schedule.Stages, e.cfg.Stage, len(e.cfg.Chunks)
	prev, next := (s+p-1)%p, (s+1)%p
	var ib *inbound
	if p > 1 {
		ib = e.actIn[prev]
	}
	if ib != nil {
		keys := make([]key, 0, n*len(ib.infer))
		for i := range n {
			for _, k := range ib.infer {
				keys = append(keys, key{i, k.chunk})
			}
		}
		ib.start <- plan{ctx, keys, data}
	}
	fail := func(err error) (float64, int, error) {
		e.broken = fmt.Errorf("pipeline stage %d, inference: %w", s, err)
		return 0, 0, e.broken
	}
	var ce nn.SoftmaxCrossEntropy
	for i := range n {
		rows := data.Rows(i)
		for k, c := range e.cfg.Chunks {
			j := k*p + s
			var buf []float32
			var err error
			if j == 0 {
				buf = <-e.actPool[k]
				err = data.Inputs(i, buf[:rows*c.In])
			} else {
				a := <-ib.out
				buf, err = a.buf, a.err
			}
			if err != nil {
				return fail(err)
			}
			// Slot 0 keeps a reference to buf, which the receiver may
			// refill: no backward reads it.
			y := c.Stage.Forward(0, nn.Matrix{Rows: rows, Cols: c.In, Data: buf[:rows*c.In]})
			e.actPool[k] <- buf
			if y.Rows != rows || y.Cols != c.Out {
				return fail(&ShapeError{fmt.Sprintf("chunk %d gives %d×%d outputs, the pipeline expects %d×%d", k, y.Rows, y.Cols, rows, c.Out)})
			}
			if j == p*v-1 {
				sum, ok, _, err := ce.Loss(y, data.Labels(i), 1)
				if err != nil {
					return fail(err)
				}
				loss += sum
				correct += ok
				continue
			}
			if p > 1 {
				if err := e.cfg.Links.ActOut[next].Send(ctx, y.Data); err != nil {
					return fail(err)
				}
			} else {
				return fail(fmt.Errorf("a one-stage pipeline of %d chunks", v))
			}
		}
	}
	return loss, correct, nil
}
