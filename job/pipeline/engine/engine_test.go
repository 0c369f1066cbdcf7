package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/job/pipeline/schedule"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/trace"
)

// model is a deep MLP's layers, with the same weights every call.
func model(seed uint64, in, width, depth, classes int) []nn.Layer {
	rng := rand.New(rand.NewPCG(seed, 7))
	var ls []nn.Layer
	w := in
	for d := range depth {
		ls = append(ls, nn.NewDense(fmt.Sprintf("fc%d", d), w, width, rng), &nn.ReLU{})
		w = width
	}
	return append(ls, nn.NewDense("out", w, classes, rng))
}

// batch is a global batch of random inputs and labels.
type batch struct {
	x      []float32
	labels []int32
	in     int
	rows   int // per micro-batch
}

func newBatch(seed uint64, n, in, classes, rows int) *batch {
	rng := rand.New(rand.NewPCG(seed, 9))
	b := &batch{x: make([]float32, n*in), labels: make([]int32, n), in: in, rows: rows}
	for i := range b.x {
		b.x[i] = float32(rng.NormFloat64())
	}
	for i := range b.labels {
		b.labels[i] = int32(rng.IntN(classes))
	}
	return b
}

func (b *batch) Inputs(micro int, x []float32) error {
	copy(x, b.x[micro*b.rows*b.in:(micro+1)*b.rows*b.in])
	return nil
}

func (b *batch) Labels(micro int) []int32 { return b.labels[micro*b.rows : (micro+1)*b.rows] }
func (b *batch) Rows(int) int             { return b.rows }
func (b *batch) Scale() float32           { return 1 / float32(len(b.labels)) }

// pipe is a pipeline of in-process stages over collective groups.
type pipe struct {
	engines []*Engine
	conns   []*Connected
	chunks  [][]Chunk
}

// cutEven splits n layers into parts pieces of nearly equal length.
func cutEven(n, parts int) [][2]int {
	var r [][2]int
	for i := range parts {
		r = append(r, [2]int{i * n / parts, (i + 1) * n / parts})
	}
	return r
}

func widthsOf(ls []nn.Layer, in int) []int {
	w := []int{in}
	for _, l := range ls {
		if d, ok := l.(*nn.Dense); ok {
			in = d.W.Shape[1]
		}
		w = append(w, in)
	}
	return w
}

func newPipe(t testing.TB, sc schedule.Config, layers []nn.Layer, in, rows int, data Data, recompute bool, ready func(stage, chunk, param int)) *pipe {
	t.Helper()
	p, v := sc.Stages, max(sc.Chunks, 1)
	pieces := cutEven(len(layers), p*v)
	widths := widthsOf(layers, in)
	net := collective.NewInprocNetwork()
	pp := &pipe{engines: make([]*Engine, p), conns: make([]*Connected, p), chunks: make([][]Chunk, p)}
	addrs := make([]string, p)
	for s := range addrs {
		addrs[s] = fmt.Sprintf("stage%d", s)
	}
	var wg sync.WaitGroup
	errs := make([]error, p)
	for s := range p {
		for k := range v {
			r := pieces[k*p+s]
			st, err := nn.NewStage(layers[r[0]:r[1]], nn.StageOptions{Recompute: recompute, First: r[0] == 0})
			if err != nil {
				t.Fatal(err)
			}
			pp.chunks[s] = append(pp.chunks[s], Chunk{Stage: st, In: widths[r[0]], Out: widths[r[1]]})
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			pp.conns[s], errs[s] = Connect(ctx, net, LinkSpec{Job: "eq", Generation: 1, Schedule: sc, Stage: s, Addrs: addrs,
				Options: collective.Options{Timeout: 10 * time.Second}})
		}()
	}
	wg.Wait()
	for s, err := range errs {
		if err != nil {
			t.Fatalf("stage %d: %v", s, err)
		}
	}
	for s := range p {
		cfg := Config{Schedule: sc, Stage: s, Chunks: pp.chunks[s], Rows: rows, Links: pp.conns[s].Links, Data: data}
		if ready != nil {
			cfg.Ready = func(k, param int) { ready(s, k, param) }
		}
		e, err := New(cfg)
		if err != nil {
			t.Fatalf("stage %d: %v", s, err)
		}
		pp.engines[s] = e
	}
	t.Cleanup(func() { // at once: a group's Close waits for its peer's
		var wg sync.WaitGroup
		for s := range p {
			pp.engines[s].Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				pp.conns[s].Close()
			}()
		}
		wg.Wait()
	})
	return pp
}

// step runs one step on every stage at once.
func (pp *pipe) step(t testing.TB) []Stats {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stats := make([]Stats, len(pp.engines))
	errs := make([]error, len(pp.engines))
	var wg sync.WaitGroup
	for s, e := range pp.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[s], errs[s] = e.Step(ctx)
		}()
	}
	wg.Wait()
	for s, err := range errs {
		if err != nil {
			t.Fatalf("stage %d: %v", s, err)
		}
	}
	return stats
}

// reference runs the unpipelined model on the whole batch: the loss's
// gradient scaled by 1/the batch, as the pipeline's.
func reference(t testing.TB, layers []nn.Layer, b *batch, n, classes int) (float64, []*nn.Param) {
	t.Helper()
	seq := nn.NewSequential(layers...)
	nn.ZeroGrads(seq.Params())
	y := seq.Forward(nn.Matrix{Rows: n, Cols: b.in, Data: b.x})
	var ce nn.SoftmaxCrossEntropy
	sum, _, g, err := ce.Loss(y, b.labels, 1/float32(n))
	if err != nil {
		t.Fatal(err)
	}
	seq.Backward(g, nil)
	return sum, seq.Params()
}

func relClose(a, b []float32, tol float64) (int, float64, bool) {
	var num, den float64
	worst, at := 0.0, -1
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		num += d * d
		den += float64(b[i]) * float64(b[i])
		if s := d / (math.Abs(float64(b[i])) + 1e-6); s > worst {
			worst, at = s, i
		}
	}
	return at, worst, math.Sqrt(num) <= tol*math.Sqrt(den)+1e-9
}

func stageParams(pp *pipe) map[string]*nn.Param {
	ps := map[string]*nn.Param{}
	for _, cs := range pp.chunks {
		for _, c := range cs {
			for _, p := range c.Stage.Params() {
				ps[p.Name] = p
			}
		}
	}
	return ps
}

// One pipelined step's gradients equal the unpipelined model's on the same
// global batch, within 1e-5 relative, for every schedule, P = 2 and 4, and
// m = 1, 4 and 8; and its loss is the same.
func TestGradientsEqualUnpipelined(t *testing.T) {
	const in, width, depth, classes, rows = 12, 16, 7, 5, 3
	type tc struct {
		sc        schedule.Config
		recompute bool
	}
	var cases []tc
	for _, p := range []int{2, 4} {
		for _, m := range []int{1, 4, 8} {
			for _, k := range schedule.Kinds {
				c := schedule.Config{Kind: k, Stages: p, Micro: m, Chunks: 1}
				if k == schedule.Interleaved {
					if m%p != 0 {
						continue
					}
					c.Chunks = 2
				}
				cases = append(cases, tc{sc: c})
			}
		}
	}
	cases = append(cases, tc{sc: schedule.Config{Kind: schedule.OneFOneB, Stages: 4, Micro: 8}, recompute: true},
		tc{sc: schedule.Config{Kind: schedule.ZBH1, Stages: 2, Micro: 4}, recompute: true})
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/P=%d/m=%d/v=%d/recompute=%v", c.sc.Kind, c.sc.Stages, c.sc.Micro, c.sc.Chunks, c.recompute), func(t *testing.T) {
			n := rows * c.sc.Micro
			b := newBatch(3, n, in, classes, rows)
			_, want := reference(t, model(1, in, width, depth, classes), b, n, classes)
			pp := newPipe(t, c.sc, model(1, in, width, depth, classes), in, rows, b, c.recompute, nil)
			stats := pp.step(t)
			got := stageParams(pp)
			if len(got) != len(want) {
				t.Fatalf("pipeline holds %d parameters, the model %d", len(got), len(want))
			}
			for _, w := range want {
				g := got[w.Name]
				if at, worst, ok := relClose(g.Grad, w.Grad, 1e-5); !ok {
					t.Errorf("%s: gradient differs (worst at %d: %v vs %v, rel %.3g)", w.Name, at, g.Grad[at], w.Grad[at], worst)
				}
			}
			last := stats[c.sc.Stages-1]
			wantLoss, _ := reference(t, model(1, in, width, depth, classes), b, n, classes)
			if math.Abs(last.LossSum-wantLoss) > 1e-4*math.Abs(wantLoss) {
				t.Errorf("loss %v, unpipelined %v", last.LossSum, wantLoss)
			}
			for s, st := range stats {
				if bound := schedule.Bound(c.sc, s); st.Peak != bound {
					t.Errorf("stage %d held %d micro-batches at once, the schedule's bound is %d", s, st.Peak, bound)
				}
			}
		})
	}
}

// current is a Data whose batch a test replaces between steps.
type current struct{ b *batch }

func (c *current) Inputs(micro int, x []float32) error { return c.b.Inputs(micro, x) }
func (c *current) Labels(micro int) []int32            { return c.b.Labels(micro) }
func (c *current) Rows(micro int) int                  { return c.b.Rows(micro) }
func (c *current) Scale() float32                      { return c.b.Scale() }

// After 50 steps of SGD the pipelined parameters equal the unpipelined
// ones within 1e-4.
func TestFiftyStepsEqualUnpipelined(t *testing.T) {
	const in, width, depth, classes, rows, steps = 12, 16, 5, 5, 4, 50
	for _, sc := range []schedule.Config{
		{Kind: schedule.OneFOneB, Stages: 2, Micro: 4},
		{Kind: schedule.ZBH1, Stages: 4, Micro: 8},
		{Kind: schedule.Interleaved, Stages: 2, Micro: 4, Chunks: 2},
		{Kind: schedule.GPipe, Stages: 4, Micro: 1},
	} {
		t.Run(string(sc.Kind), func(t *testing.T) {
			n := rows * sc.Micro
			seq := nn.NewSequential(model(5, in, width, depth, classes)...)
			data := &current{}
			pp := newPipe(t, sc, model(5, in, width, depth, classes), in, rows, data, false, nil)
			for s, e := range pp.engines {
				var ps []*nn.Param
				for _, c := range pp.chunks[s] {
					ps = append(ps, c.Stage.Params()...)
				}
				e.cfg.Update = func(context.Context) error { sgd(ps, 0.1); return nil }
			}
			for step := range steps {
				data.b = newBatch(uint64(100+step), n, in, classes, rows)
				nn.ZeroGrads(seq.Params())
				y := seq.Forward(nn.Matrix{Rows: n, Cols: in, Data: data.b.x})
				var ce nn.SoftmaxCrossEntropy
				_, _, g, err := ce.Loss(y, data.b.labels, 1/float32(n))
				if err != nil {
					t.Fatal(err)
				}
				seq.Backward(g, nil)
				sgd(seq.Params(), 0.1)
				pp.step(t)
			}
			got := stageParams(pp)
			for _, w := range seq.Params() {
				if at, worst, ok := relClose(got[w.Name].Value, w.Value, 1e-4); !ok {
					t.Errorf("%s after %d steps: differs (worst at %d: %v vs %v, rel %.3g)", w.Name, steps, at, got[w.Name].Value[at], w.Value[at], worst)
				}
			}
		})
	}
}

// sgd takes a plain SGD step and zeroes the gradients.
func sgd(ps []*nn.Param, lr float32) {
	for _, p := range ps {
		for i, g := range p.Grad {
			p.Value[i] -= lr * g
			p.Grad[i] = 0
		}
	}
}

// A step in steady state allocates nothing: buffers come from pools sized
// by the schedule, the receivers are long-lived, and the links' groups
// reuse their frames. Every stage runs on a goroutine of its own that
// lives across the measured steps, as a stage process's loop does.
func TestStepAllocatesNothing(t *testing.T) {
	const in, width, depth, classes, rows = 32, 64, 5, 10, 8
	for _, c := range []struct {
		sc        schedule.Config
		recompute bool
	}{
		{sc: schedule.Config{Kind: schedule.OneFOneB, Stages: 2, Micro: 8}},
		{sc: schedule.Config{Kind: schedule.ZBH1, Stages: 2, Micro: 8}},
		{sc: schedule.Config{Kind: schedule.Interleaved, Stages: 2, Micro: 4, Chunks: 2}},
		{sc: schedule.Config{Kind: schedule.GPipe, Stages: 2, Micro: 4}, recompute: true},
	} {
		t.Run(fmt.Sprintf("%s/recompute=%v", c.sc.Kind, c.recompute), func(t *testing.T) {
			b := newBatch(1, rows*c.sc.Micro, in, classes, rows)
			pp := newPipe(t, c.sc, model(1, in, width, depth, classes), in, rows, b, c.recompute, func(int, int, int) {})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // bounds every measured step
			defer cancel()
			start, done := make(chan struct{}), make(chan error)
			for _, e := range pp.engines {
				go func() {
					for range start {
						_, err := e.Step(ctx)
						done <- err
					}
				}()
			}
			defer close(start)
			var failed error
			run := func() {
				for range pp.engines {
					start <- struct{}{}
				}
				for range pp.engines {
					if err := <-done; err != nil && failed == nil {
						failed = err
					}
				}
			}
			run() // the first step grows the layers' slots
			allocs := testing.AllocsPerRun(20, run)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Errorf("a step of %d stages allocated %v times", len(pp.engines), allocs)
			}
		})
	}
}

// A stage receiving a tensor of the wrong size or type from a peer fails
// its step with an error naming the mismatch, never a hang: a peer that
// sends float64 activations, and one whose activations are a column wider
// than the stage takes.
func TestPeerSpeakingGarbage(t *testing.T) {
	const in, width, depth, classes, rows = 8, 16, 3, 4, 2
	sc := schedule.Config{Kind: schedule.OneFOneB, Stages: 2, Micro: 2}
	for _, c := range []struct {
		name string
		send func(ctx context.Context, l groupLink) error
		want string
	}{
		{"float64", func(ctx context.Context, l groupLink) error {
			return l.g.Send(ctx, l.peer, collective.Float64s(make([]float64, rows*width)))
		}, "float64"},
		{"wider", func(ctx context.Context, l groupLink) error {
			return l.g.Send(ctx, l.peer, collective.Float32s(make([]float32, rows*(width+1))))
		}, "elements"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBatch(1, rows*sc.Micro, in, classes, rows)
			pp := newPipe(t, sc, model(1, in, width, depth, classes), in, rows, b, false, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			go c.send(ctx, pp.conns[0].Links.ActOut[1].(groupLink)) // stage 0 speaks garbage
			_, err := pp.engines[1].Step(ctx)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("stage 1's step: %v, want an error about %q", err, c.want)
			}
			if _, again := pp.engines[1].Step(ctx); again == nil {
				t.Errorf("a broken engine stepped again")
			}
		})
	}
}

// TestStatsAccountEveryInstruction: on a clock that advances one tick at
// each reading, a step's Busy, Wait and Send count exactly the stage's
// compute, receive and send instructions, and Sched every one of them up
// to the reduction: nothing measured twice, nothing left out.
func TestStatsAccountEveryInstruction(t *testing.T) {
	const in, width, depth, classes, rows = 12, 16, 7, 5, 3
	for _, k := range schedule.Kinds {
		sc := schedule.Config{Kind: k, Stages: 2, Micro: 4, Chunks: 1}
		if k == schedule.Interleaved {
			sc.Chunks = 2
		}
		t.Run(string(k), func(t *testing.T) {
			b := newBatch(3, sc.Micro*rows, in, classes, rows)
			pp := newPipe(t, sc, model(4, in, width, depth, classes), in, rows, b, false, nil)
			for _, e := range pp.engines {
				var tick time.Duration
				e.now = func() time.Time { tick += time.Millisecond; return time.Unix(0, 0).Add(tick) }
			}
			for s, st := range pp.step(t) {
				list, err := schedule.Build(sc, s)
				if err != nil {
					t.Fatal(err)
				}
				var compute, recv, send time.Duration
				for _, in := range list {
					switch in.Op {
					case schedule.Forward, schedule.Backward, schedule.BackwardInput, schedule.BackwardWeight:
						compute += time.Millisecond
					case schedule.RecvAct, schedule.RecvGrad:
						recv += time.Millisecond
					case schedule.SendAct, schedule.SendGrad:
						send += time.Millisecond
					}
				}
				if st.Busy != compute || st.Wait != recv || st.Send != send || st.Sched != 2*(compute+recv+send)+time.Millisecond {
					t.Errorf("stage %d: busy %v wait %v send %v sched %v; want %v %v %v %v", s, st.Busy, st.Wait, st.Send, st.Sched,
						compute, recv, send, 2*(compute+recv+send)+time.Millisecond)
				}
			}
		})
	}
}

// TestInstructionsTraced: with a trace, every instruction of every step
// is a span of its stage's "instructions" thread, named as the schedule
// names it; the merged trace is well formed (no span open, none
// overlapping on a thread).
func TestInstructionsTraced(t *testing.T) {
	const in, width, depth, classes, rows, steps = 32, 64, 5, 10, 8, 3
	sc := schedule.Config{Kind: schedule.OneFOneB, Stages: 2, Micro: 4}
	b := newBatch(1, rows*sc.Micro, in, classes, rows)
	pp := newPipe(t, sc, model(1, in, width, depth, classes), in, rows, b, false, nil)
	dir := t.TempDir()
	var parts []trace.Part
	for s, e := range pp.engines {
		p := trace.Part{Process: fmt.Sprintf("pipeline-worker-%d", s), Path: filepath.Join(dir, fmt.Sprintf("%d.jsonl", s))}
		r, err := trace.Create(p.Path, p.Process)
		if err != nil {
			t.Fatal(err)
		}
		e.cfg.Trace = r
		e.names = make([]string, len(e.list))
		for i, in := range e.list {
			e.names[i] = in.String()
		}
		parts = append(parts, p)
	}
	for range steps {
		pp.step(t)
	}
	for _, e := range pp.engines {
		if err := e.cfg.Trace.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if _, err := trace.Merge(&out, parts); err != nil {
		t.Fatal(err)
	}
	if err := trace.CheckFile(out.Bytes()); err != nil {
		t.Fatal(err)
	}
	var f trace.File
	if err := json.Unmarshal(out.Bytes(), &f); err != nil {
		t.Fatal(err)
	}
	count := map[int]int{}
	names := map[string]bool{}
	for _, ev := range f.TraceEvents {
		if ev.Ph == "X" && ev.Cat == trace.ThreadPipeline {
			count[ev.Pid]++
			names[ev.Name] = true
		}
	}
	for s, e := range pp.engines {
		if want := steps * len(e.list); count[s] != want {
			t.Errorf("stage %d: %d instruction spans, want %d", s, count[s], want)
		}
		for _, in := range e.list {
			if !names[in.String()] {
				t.Errorf("no span named %q", in.String())
			}
		}
	}
}
