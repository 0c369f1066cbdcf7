package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// The examples' MLP and global batch: what the training-throughput figure
// measures.
const (
	mlpIn, mlpHidden, mlpClasses = 784, 512, 10
	mlpBatch                     = 256
)

// mlpModel is Dense-ReLU-Dense-ReLU-Dense with softmax cross-entropy.
type mlpModel struct {
	net  *nn.Sequential
	loss nn.SoftmaxCrossEntropy
}

func newMLP(seed uint64) *mlpModel {
	rng := rand.New(rand.NewPCG(seed, 1))
	return &mlpModel{net: nn.NewSequential(nn.NewDense("d1", mlpIn, mlpHidden, rng), &nn.ReLU{},
		nn.NewDense("d2", mlpHidden, mlpHidden, rng), &nn.ReLU{}, nn.NewDense("d3", mlpHidden, mlpClasses, rng))}
}

func (m *mlpModel) Params() []*nn.Param { return m.net.Params() }

func (m *mlpModel) Step(b *Batch, scale float32, ready func(int)) (Result, error) {
	sum, correct, grad, err := m.loss.Loss(m.net.Forward(nn.Matrix{Rows: b.N, Cols: b.Features, Data: b.X}), b.Labels, scale)
	if err != nil {
		return Result{}, err
	}
	m.net.Backward(grad, ready)
	return Result{LossSum: sum, Correct: correct}, nil
}

// noise is random MNIST-shaped data.
type noise struct {
	x []float32
	y []int32
}

func newNoise(n int) *noise {
	rng := rand.New(rand.NewPCG(7, 8))
	d := &noise{x: make([]float32, n*mlpIn), y: make([]int32, n)}
	for i := range d.x {
		d.x[i] = rng.Float32()
	}
	for i := range d.y {
		d.y[i] = int32(rng.IntN(mlpClasses))
	}
	return d
}

func (d *noise) Len() int { return len(d.y) }

func (d *noise) Fill(idx []int, out *Batch) error {
	out.Reset(len(idx), mlpIn)
	for k, i := range idx {
		copy(out.X[k*mlpIn:(k+1)*mlpIn], d.x[i*mlpIn:(i+1)*mlpIn])
		out.Labels[k] = d.y[i]
	}
	return nil
}

// tcpGroups joins n ranks over loopback TCP inside this process.
func tcpGroups(ctx context.Context, tb testing.TB, n int) []*collective.Group {
	tb.Helper()
	trs := make([]*collective.TCPTransport, n)
	peers := make([]string, n)
	for r := range n {
		tr, err := collective.ListenTCP(collective.TCPOptions{Bind: "127.0.0.1:0"})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tr.Close() })
		trs[r], peers[r] = tr, tr.Addr()
	}
	groups := make([]*collective.Group, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			groups[r], errs[r] = collective.Join(ctx, trs[r], collective.Membership{Job: "step-bench", Generation: 1, Rank: r, Peers: peers},
				collective.Options{Timeout: time.Minute})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() { collective.CloseGroups(groups) })
	return groups
}

// mlpRanks builds one MLP trainer per group, identical on every rank.
func mlpRanks(ctx context.Context, tb testing.TB, groups []*collective.Group) []*Trainer {
	tb.Helper()
	data := newNoise(4096)
	out := make([]*Trainer, len(groups))
	for r, g := range groups {
		m := newMLP(1)
		opt, err := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum"}, m.Params())
		if err != nil {
			tb.Fatal(err)
		}
		tr, err := NewTrainer(ctx, g, m, data, opt, Config{GlobalBatch: mlpBatch, Schedule: nn.Schedule{Base: 0.01}, Seed: 3}, nil)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(tr.Close)
		out[r] = tr
	}
	return out
}

// stepModes are the ways a step is run in the benchmarks: the overlapped
// step (buckets reduced while backward runs), the sequential one (reduce
// after backward, as Compute then Finish) and the compute alone (no
// communication; every rank still computes its share concurrently).
var stepModes = []struct {
	name string
	run  func(context.Context, *Trainer) error
}{
	{"overlap", func(ctx context.Context, t *Trainer) error { _, err := t.Step(ctx); return err }},
	{"sequential", func(ctx context.Context, t *Trainer) error {
		if err := t.Compute(ctx); err != nil {
			return err
		}
		_, err := t.Finish(ctx)
		return err
	}},
	{"compute", func(ctx context.Context, t *Trainer) error { return t.Compute(ctx) }},
}

// runSteps runs n steps of mode on every rank at once.
func runSteps(ctx context.Context, ranks []*Trainer, n int, run func(context.Context, *Trainer) error) error {
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for r, t := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				if errs[r] = run(ctx, t); errs[r] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkStep is one training step of the MLP (784-512-512-10, global
// batch 256) on 1, 2 and 4 ranks in this process, over the in-process
// transport and over loopback TCP, overlapped, sequential and compute only.
// ns/op is the step time; allocs/op are every rank's together.
//
//	go test ./worker/ -run x -bench Step -benchtime 40x -cpuprofile cpu.out -memprofile mem.out
func BenchmarkStep(b *testing.B) {
	for _, transport := range []string{"inproc", "tcp"} {
		for _, n := range []int{1, 2, 4} {
			if transport == "tcp" && n == 1 {
				continue
			}
			for _, mode := range stepModes {
				b.Run(fmt.Sprintf("%s/N=%d/%s", transport, n, mode.name), func(b *testing.B) {
					ctx := context.Background()
					var groups []*collective.Group
					if transport == "tcp" {
						groups = tcpGroups(ctx, b, n)
					} else {
						var err error
						if groups, err = collective.InprocGroups(ctx, n, "step-bench", 1, collective.Options{Timeout: time.Minute}); err != nil {
							b.Fatal(err)
						}
						b.Cleanup(func() { collective.CloseGroups(groups) })
					}
					ranks := mlpRanks(ctx, b, groups)
					if err := runSteps(ctx, ranks, 2, mode.run); err != nil { // warm buffers
						b.Fatal(err)
					}
					b.ReportAllocs()
					b.ResetTimer()
					if err := runSteps(ctx, ranks, b.N, mode.run); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(mlpBatch)*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
				})
			}
		}
	}
}

// linearModel is a linear least-squares classifier written out by hand (no
// nn layers, so that TestStepAllocs counts the trainer's allocations only),
// with a decayed extra parameter so that its gradients span two buckets.
type linearModel struct {
	w, b, extra *nn.Param
	out         []float32
}

func newLinearModel() *linearModel {
	m := &linearModel{w: nn.NewParam("w", blobClasses, blobFeatures), b: nn.NewParam("b", blobClasses), extra: nn.NewParam("extra", 32),
		out: make([]float32, blobClasses)}
	for i := range m.extra.Value {
		m.extra.Value[i] = float32(i) / 32
	}
	return m
}

func (m *linearModel) Params() []*nn.Param { return []*nn.Param{m.w, m.b, m.extra} }

func (m *linearModel) Step(b *Batch, scale float32, ready func(int)) (Result, error) {
	for i, v := range m.extra.Value {
		m.extra.Grad[i] += scale * float32(b.N) * v
	}
	if ready != nil {
		ready(2)
	}
	var res Result
	for n := range b.N {
		x := b.X[n*b.Features : (n+1)*b.Features]
		best := 0
		for c := range blobClasses {
			o := m.b.Value[c]
			for f, v := range x {
				o += m.w.Value[c*blobFeatures+f] * v
			}
			m.out[c] = o
			if o > m.out[best] {
				best = c
			}
		}
		if best == int(b.Labels[n]) {
			res.Correct++
		}
		for c, o := range m.out {
			e := o
			if c == int(b.Labels[n]) {
				e--
			}
			res.LossSum += float64(e * e)
			m.b.Grad[c] += scale * 2 * e
			for f, v := range x {
				m.w.Grad[c*blobFeatures+f] += scale * 2 * e * v
			}
		}
	}
	if ready != nil {
		ready(1)
		ready(0)
	}
	return res, nil
}

// TestStepAllocs: in steady state a training step allocates nothing — the
// overlapped step, the sequential one and a hybrid step — on two ranks (the
// second stepping in lockstep on its own goroutine).
func TestStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ctx := context.Background()
	groups, err := collective.InprocGroups(ctx, 2, "allocs", 1, collective.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { collective.CloseGroups(groups) })
	data := newBlobs(600)
	ranks := make([]*Trainer, 2)
	for r, g := range groups {
		m := newLinearModel()
		opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "adam"}, m.Params())
		tr, err := NewTrainer(ctx, g, m, data, opt, Config{GlobalBatch: 60, BucketBytes: 64, Schedule: nn.Schedule{Base: 0.01}, Seed: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tr.Close)
		ranks[r] = tr
	}
	if n := len(ranks[0].grads.chunks); n < 2 {
		t.Fatalf("%d gradient chunks: the test wants several buckets", n)
	}
	hybridStep := func(ctx context.Context, t *Trainer) error {
		if err := t.Compute(ctx); err != nil {
			return err
		}
		if err := t.ReduceStep(ctx, t.NextStep(), true); err != nil {
			return err
		}
		_, err := t.ApplyStep(ctx)
		return err
	}
	for _, mode := range append(stepModes[:2:2], struct {
		name string
		run  func(context.Context, *Trainer) error
	}{"hybrid", hybridStep}) {
		t.Run(mode.name, func(t *testing.T) {
			start, done := make(chan struct{}), make(chan error)
			go func() {
				for range start {
					done <- mode.run(ctx, ranks[1])
				}
			}()
			defer close(start)
			var failed error
			step := func() {
				start <- struct{}{}
				if err := mode.run(ctx, ranks[0]); err != nil && failed == nil {
					failed = err
				}
				if err := <-done; err != nil && failed == nil {
					failed = err
				}
			}
			for range 12 { // past an epoch boundary: the sampler's permutation is drawn again in place
				step()
			}
			allocs := testing.AllocsPerRun(50, step)
			if failed != nil {
				t.Fatal(failed)
			}
			if allocs != 0 {
				t.Errorf("%v allocations per step, want 0", allocs)
			}
		})
	}
}
