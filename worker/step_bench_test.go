package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// controlPlaneAllocs bounds what one rank's step allocates through the
// actors (TestRankActorStepAllocs). Measured: 0.0 a rank on two ranks, as
// a bulk-synchronous step sends no control message (it was 8.5 with the
// StepReady/StepGo round trip); the bound leaves room for protoactor
// scheduling a mailbox that had gone idle. The Trainer allocates nothing.
const controlPlaneAllocs = 1

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
	trs := make([]collective.Transport, n)
	peers := make([]string, n)
	for r := range n {
		tr, err := collective.ListenTCP(collective.TCPOptions{Bind: "127.0.0.1:0"})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tr.Close() })
		trs[r], peers[r] = tr, tr.Addr()
	}
	groups, err := collective.JoinAll(ctx, trs, collective.Membership{Job: "step-bench", Generation: 1, Peers: peers},
		collective.Options{Timeout: time.Minute})
	if err != nil {
		tb.Fatal(err)
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
	run  func(context.Context, *Trainer) (StepStats, error)
}{
	{"overlap", func(ctx context.Context, t *Trainer) (StepStats, error) { return t.Step(ctx) }},
	{"sequential", func(ctx context.Context, t *Trainer) (StepStats, error) {
		if err := t.Compute(ctx); err != nil {
			return StepStats{}, err
		}
		return t.Finish(ctx)
	}},
	{"compute", func(ctx context.Context, t *Trainer) (StepStats, error) {
		err := t.Compute(ctx)
		return StepStats{Compute: t.pend.compute}, err
	}},
}

// runSteps runs n steps of mode on every rank at once, and returns the
// ranks' compute and communication times summed over the steps and ranks.
func runSteps(ctx context.Context, ranks []*Trainer, n int, run func(context.Context, *Trainer) (StepStats, error)) (compute, comm time.Duration, err error) {
	errs := make([]error, len(ranks))
	sums := make([][2]time.Duration, len(ranks))
	var wg sync.WaitGroup
	for r, t := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				var st StepStats
				if st, errs[r] = run(ctx, t); errs[r] != nil {
					return
				}
				sums[r][0] += st.Compute
				sums[r][1] += st.Comm
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return 0, 0, err
		}
		compute += sums[r][0]
		comm += sums[r][1]
	}
	return compute, comm, nil
}

// BenchmarkStep is one training step of the MLP (784-512-512-10, global
// batch 256) on 1, 2 and 4 ranks in this process, over the in-process
// transport and over loopback TCP, overlapped, sequential and compute only.
// ns/op is the step time; allocs/op are every rank's together;
// compute-ms and comm-ms are a rank's mean model time and wait for the
// reductions after it (StepStats.Compute and Comm): in the sequential mode
// comm-ms is the whole communication, in the overlapped one what backward
// did not hide.
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
					ctx := testContext(b)
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
					if _, _, err := runSteps(ctx, ranks, 2, mode.run); err != nil { // warm buffers
						b.Fatal(err)
					}
					b.ReportAllocs()
					b.ResetTimer()
					compute, comm, err := runSteps(ctx, ranks, b.N, mode.run)
					if err != nil {
						b.Fatal(err)
					}
					steps := float64(b.N * n)
					b.ReportMetric(float64(mlpBatch)*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
					b.ReportMetric(compute.Seconds()*1e3/steps, "compute-ms")
					b.ReportMetric(comm.Seconds()*1e3/steps, "comm-ms")
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
	first       func()       // runs as Step begins
	mid         func() error // runs between the two chunks' readiness, when overlapping
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
	if m.first != nil {
		m.first()
	}
	for i, v := range m.extra.Value {
		m.extra.Grad[i] += scale * float32(b.N) * v
	}
	if ready != nil {
		ready(2)
		if m.mid != nil {
			if err := m.mid(); err != nil {
				return Result{}, err
			}
		}
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
// second stepping in lockstep on its own goroutine), over in-process pipes
// and over loopback TCP, with a cancellable context as a worker's.
func TestStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates; the non-race pass (go test without -race, as scripts/test runs it) runs this test")
	}
	for _, transport := range []string{"inproc", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var groups []*collective.Group
			if transport == "tcp" {
				groups = tcpGroups(ctx, t, 2)
			} else {
				var err error
				if groups, err = collective.InprocGroups(ctx, 2, "allocs", 1, collective.Options{Timeout: time.Minute}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { collective.CloseGroups(groups) })
			}
			stepAllocs(t, ctx, groups)
		})
	}
}

// stepAllocs checks that every step mode allocates nothing on the two
// ranks of groups.
func stepAllocs(t *testing.T, ctx context.Context, groups []*collective.Group) {
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
	for _, mode := range append(stepModes[:2:2], hybridModes...) {
		t.Run(mode.name, func(t *testing.T) {
			start, done := make(chan struct{}), make(chan error)
			go func() {
				for range start {
					_, err := mode.run(ctx, ranks[1])
					done <- err
				}
			}()
			defer close(start)
			var failed error
			step := func() {
				start <- struct{}{}
				if _, err := mode.run(ctx, ranks[0]); err != nil && failed == nil {
					failed = err
				}
				select {
				case err := <-done:
					if err != nil && failed == nil {
						failed = err
					}
				case <-ctx.Done():
					if failed == nil {
						failed = fmt.Errorf("rank 1's step did not end: %w", ctx.Err())
					}
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

// hybridModes are a hybrid step with every rank taking part, as the rank
// actor runs it: deadline-closed (buckets sent once the step closed) and
// overlapped (buckets sent during backward, announced by the group).
var hybridModes = []struct {
	name string
	run  func(context.Context, *Trainer) (StepStats, error)
}{
	{"hybrid", func(ctx context.Context, t *Trainer) (StepStats, error) { return hybridStep(ctx, t, t.Compute) }},
	{"hybrid-overlap", func(ctx context.Context, t *Trainer) (StepStats, error) {
		return hybridStep(ctx, t, t.ComputeOverlapped)
	}},
}

func hybridStep(ctx context.Context, t *Trainer, compute func(context.Context) error) (StepStats, error) {
	if err := compute(ctx); err != nil {
		return StepStats{}, err
	}
	if err := t.ReduceStep(ctx, t.NextStep(), true); err != nil {
		return StepStats{}, err
	}
	return t.ApplyStep(ctx)
}

// BenchmarkHybridStep compares a hybrid step with every rank on time
// deadline-closed and overlapped, over loopback TCP, in turns of a few steps
// on the same ranks like BenchmarkStepOverlap (the control plane's round
// trip, the same in both, is left out). hidden-% is the share of the
// deadline-closed step's communication (it − compute) the overlapped step
// no longer pays.
//
//	go test ./worker/ -run x -bench HybridStep -benchtime 10x
func BenchmarkHybridStep(b *testing.B) {
	for _, n := range []int{2, 4} {
		b.Run(fmt.Sprintf("tcp/N=%d", n), func(b *testing.B) {
			ctx := testContext(b)
			ranks := mlpRanks(ctx, b, tcpGroups(ctx, b, n))
			modes := append(hybridModes[:2:2], stepModes[2])
			var spent [3]time.Duration
			const turn = 4
			for i := range b.N + 1 {
				for m, mode := range modes {
					start := time.Now()
					if _, _, err := runSteps(ctx, ranks, turn, mode.run); err != nil {
						b.Fatal(err)
					}
					if i > 0 {
						spent[m] += time.Since(start)
					}
				}
			}
			ms := func(m int) float64 { return spent[m].Seconds() * 1e3 / float64(b.N*turn) }
			b.ReportMetric(ms(0), "deadline-ms")
			b.ReportMetric(ms(1), "overlap-ms")
			b.ReportMetric(ms(2), "compute-ms")
			b.ReportMetric(100*(ms(0)-ms(1))/(ms(0)-ms(2)), "hidden-%")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkStepOverlap measures how much of the communication the overlap
// hides, over loopback TCP: the three modes of BenchmarkStep run in turns of
// a few steps on the same ranks, so that a noisy machine disturbs them
// alike. It reports each mode's wall time per step and hidden-%, the share
// of the sequential step's communication (sequential − compute) that the
// overlapped step no longer pays: (sequential − overlap) / (sequential −
// compute).
//
//	go test -tags openblas ./worker/ -run x -bench StepOverlap -benchtime 10x
func BenchmarkStepOverlap(b *testing.B) {
	for _, n := range []int{2, 4} {
		b.Run(fmt.Sprintf("tcp/N=%d", n), func(b *testing.B) {
			ctx := testContext(b)
			ranks := mlpRanks(ctx, b, tcpGroups(ctx, b, n))
			var spent [3]time.Duration
			const turn = 4 // steps per mode per turn
			for i := range b.N + 1 {
				for m, mode := range stepModes {
					start := time.Now()
					if _, _, err := runSteps(ctx, ranks, turn, mode.run); err != nil {
						b.Fatal(err)
					}
					if i > 0 { // the first turn warms buffers and connections
						spent[m] += time.Since(start)
					}
				}
			}
			ms := func(m int) float64 { return spent[m].Seconds() * 1e3 / float64(b.N*turn) }
			b.ReportMetric(ms(0), "overlap-ms")
			b.ReportMetric(ms(1), "sequential-ms")
			b.ReportMetric(ms(2), "compute-ms")
			b.ReportMetric(100*(ms(1)-ms(0))/(ms(1)-ms(2)), "hidden-%")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestRankActorStepAllocs measures a bulk-synchronous step driven through
// the actors — rank actors computing and finishing on the Trainer, with a
// group actor beside them, as a worker runs them — on two ranks
// over loopback TCP. The Trainer's part allocates nothing (TestStepAllocs);
// the control plane's messages are protobufs handed to protoactor and
// allocate a fixed few a rank per step, whatever the model's size: the test
// holds them to controlPlaneAllocs a rank, and checks they do not grow with
// the number of gradient buckets (one bucket, then one per 64 bytes: two).
func TestRankActorStepAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector; the non-race pass (go test without -race, as scripts/test runs it) runs this test")
	}
	const world = 2
	few := rankActorStepAllocs(t, world, 1<<20)
	many := rankActorStepAllocs(t, world, 64)
	t.Logf("allocations a rank per step through the actors: %.1f with 1 bucket, %.1f with %d", few.perRank, many.perRank, many.buckets)
	if many.buckets < 2 || few.buckets != 1 {
		t.Fatalf("%d and %d buckets: the test wants one and several", few.buckets, many.buckets)
	}
	for _, m := range []rankActorAllocs{few, many} {
		if m.perRank > controlPlaneAllocs {
			t.Errorf("%.1f allocations a rank per step through the actors with %d buckets, more than the control plane's %d", m.perRank, m.buckets, controlPlaneAllocs)
		}
	}
	if many.perRank-few.perRank >= 0.5 {
		t.Errorf("%.1f allocations a rank per step with %d buckets, %.1f with one: a step allocates per bucket", many.perRank, many.buckets, few.perRank)
	}
}

type rankActorAllocs struct {
	perRank float64
	buckets int
}

// rankActorStepAllocs runs world rank actors and a group actor over
// loopback TCP with the given bucket size and measures a step's
// allocations. Each rank pauses in its AfterStep until the test releases
// the next step, so a measured round is exactly one step on every rank.
func rankActorStepAllocs(t *testing.T, world, bucketBytes int) rankActorAllocs {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	groups := tcpGroups(ctx, t, world)
	sys, err := actors.NewSystem(actors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Shutdown()
	data := newBlobs(600)
	groupPID := actor.NewPID(sys.Address(), "job/group")
	children := []actors.Child{{Name: "group", Props: NewGroupProps(GroupConfig{World: world, Generation: 1})}}
	stepped := make(chan int, world)
	next := make([]chan bool, world) // true: step on; false: stop
	done := make(chan error, world)
	buckets := 0
	for r := range world {
		next[r] = make(chan bool)
		m := newLinearModel()
		opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Kind: "adam"}, m.Params())
		tr, err := NewTrainer(ctx, groups[r], m, data, opt, Config{GlobalBatch: 60, BucketBytes: bucketBytes, Schedule: nn.Schedule{Base: 0.01}, Seed: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		buckets = len(tr.grads.chunks)
		children = append(children, actors.Child{Name: fmt.Sprintf("rank%d", r), Props: NewRankProps(RankConfig{
			Trainer: tr, Rank: r, Generation: 1, Steps: 1 << 40, Group: groupPID, Context: ctx,
			AfterStep: func(StepStats) (bool, error) {
				stepped <- r
				select {
				case goOn := <-next[r]:
					return !goOn, nil
				case <-ctx.Done():
					return false, ctx.Err()
				}
			},
			OnDone: func(err error) { done <- err }})})
	}
	gaveUp := make(chan error, 1)
	sup, _, err := actors.StartSupervisor(sys, "job", &actors.Strategy{GiveUp: func(e *actors.GiveUpError) { gaveUp <- e }}, children...)
	if err != nil {
		t.Fatal(err)
	}
	defer actors.StopChild(sys, sup)
	awaitStep := func() {
		for range world {
			select {
			case <-stepped:
			case err := <-done:
				t.Fatalf("a rank ended: %v", err)
			case err := <-gaveUp:
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatal("no step within the test's 2 minutes")
			}
		}
	}
	tell := func(goOn bool) {
		for r := range world {
			select {
			case next[r] <- goOn:
			case <-ctx.Done():
				t.Fatalf("rank %d never waited for its next step", r)
			}
		}
	}
	step := func() {
		tell(true)
		awaitStep()
	}
	awaitStep()
	for range 12 { // warm-up: buffers, the sampler's next epoch, the mailboxes
		step()
	}
	allocs := testing.AllocsPerRun(50, step)
	tell(false)
	for range world {
		select {
		case err := <-done:
			if !errors.Is(err, ErrStopped) {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("the ranks did not stop")
		}
	}
	return rankActorAllocs{perRank: allocs / float64(world), buckets: buckets}
}
