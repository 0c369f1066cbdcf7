package gpt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/tp"
	"github.com/phalanx-rt/phalanx/worker"
)

var small = Config{Width: 16, Depth: 2, Heads: 4, Context: 8}

// batchOf is windows idx of text as a batch.
func batchOf(t *testing.T, text string, context int, idx ...int) *worker.Batch {
	t.Helper()
	var b worker.Batch
	if err := (&Windows{Text: []byte(text), Context: context}).Fill(idx, &b); err != nil {
		t.Fatal(err)
	}
	return &b
}

const sampleText = "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, world\")\n}\n"

func near(t *testing.T, what string, got, want []float32) {
	t.Helper()
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > 1e-5*scale+1e-7 {
			t.Fatalf("%s[%d] = %v, want %v (largest %v)", what, i, got[i], want[i], scale)
		}
	}
}

// TestSplitModelEqualsWhole: the GPT built on T = 1, 2 and 4
// tensor-parallel ranks, with and without sequence parallelism (a batch
// of 24 rows: 6 a rank at T = 4), gives the whole model's loss, and each rank's
// slice of every parameter gradient equals that slice of the whole
// model's, over two steps that reuse every buffer.
func TestSplitModelEqualsWhole(t *testing.T) {
	for _, sp := range []bool{false, true} {
		t.Run(fmt.Sprintf("sequence-parallel=%v", sp), func(t *testing.T) { testSplitModel(t, sp) })
	}
}

func testSplitModel(t *testing.T, sequenceParallel bool) {
	const seed = 7
	batches := []*worker.Batch{batchOf(t, sampleText, small.Context, 0, 3, 5), batchOf(t, sampleText, small.Context, 1, 2, 7)}
	whole, err := New(small, seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	type stepResult struct {
		loss  float64
		grads map[string][]float32
	}
	var want []stepResult
	for _, b := range batches {
		nn.ZeroGrads(whole.Params())
		res, err := whole.Step(b, 1/3., nil)
		if err != nil {
			t.Fatal(err)
		}
		g := map[string][]float32{}
		for _, p := range whole.Params() {
			g[p.Name] = append([]float32(nil), p.Grad...)
		}
		want = append(want, stepResult{res.LossSum, g})
	}
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("T%d", size), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			gs, err := collective.InprocGroups(ctx, size, t.Name(), 1, collective.Options{Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer collective.CloseGroups(gs)
			errs := make([]error, size)
			var wg sync.WaitGroup
			for r, g := range gs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = func() error {
						cfg := small
						cfg.SequenceParallel = sequenceParallel
						m, err := New(cfg, seed, tp.NewComm(ctx, g))
						if err != nil {
							return err
						}
						for s, b := range batches {
							nn.ZeroGrads(m.Params())
							res, err := m.Step(b, 1/3., nil)
							if err != nil {
								return err
							}
							if d := math.Abs(res.LossSum - want[s].loss); d > 1e-5*want[s].loss {
								return fmt.Errorf("step %d: loss %v, the whole model's %v", s, res.LossSum, want[s].loss)
							}
							slices := m.Slices()
							if len(slices) != len(m.Params()) || len(slices) != len(want[s].grads) {
								return fmt.Errorf("%d slices, %d parameters, the whole model has %d", len(slices), len(m.Params()), len(want[s].grads))
							}
							for _, sl := range slices {
								part := make([]float32, len(sl.Local.Grad))
								sl.Take(want[s].grads[sl.Local.Name], part)
								near(t, fmt.Sprintf("step %d, rank %d: %s gradient", s, r, sl.Local.Name), sl.Local.Grad, part)
							}
						}
						return nil
					}()
				}()
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestConfigRefusesWhatDoesNotSplit: each shape that does not fit names
// what does not.
func TestConfigRefusesWhatDoesNotSplit(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		tp   int
		want string
	}{
		{Config{Width: 16, Depth: 1, Heads: 3, Context: 4}, 1, "3 heads do not divide the width 16"},
		{Config{Width: 24, Depth: 1, Heads: 6, Context: 4}, 4, "4 tensor-parallel ranks do not divide the 6 heads"},
		{Config{Width: 12, Depth: 1, Heads: 6, Context: 4}, 3, "3 tensor-parallel ranks do not divide the vocabulary of 256"},
		{Config{Width: 0, Depth: 1, Heads: 1, Context: 4}, 1, "each must be at least 1"},
		{Config{Width: 16, Depth: 1, Heads: 4, Context: 0}, 1, "each must be at least 1"},
	} {
		err := tc.cfg.Check(tc.tp)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v at T=%d: %v, want %q", tc.cfg, tc.tp, err, tc.want)
		}
	}
	if err := small.Check(4); err != nil {
		t.Errorf("the test model at T=4: %v", err)
	}
}

// TestReadTextRefusesWhatIsNotText: an empty file, NUL bytes and invalid
// UTF-8 are each refused naming the file and where; text is split at a
// line start into a training part and a last tenth held out.
func TestReadTextRefusesWhatIsNotText(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty.txt", "", "the file is empty"},
		{"nul.txt", "abc\x00def", "not text: a NUL byte at offset 3"},
		{"latin1.txt", "caf\xe9 au lait", "not text: invalid UTF-8 at offset 3"},
	} {
		path := filepath.Join(dir, tc.name)
		if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadText(path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want %q naming the file", tc.name, err, tc.want)
		}
		if tc.name != "empty.txt" && !errors.Is(err, ErrNotText) {
			t.Errorf("%s: %v is not ErrNotText", tc.name, err)
		}
	}
	if _, err := ReadText(filepath.Join(dir, "absent.txt")); err == nil {
		t.Error("a missing file accepted")
	}
	path := filepath.Join(dir, "ok.txt")
	text := strings.Repeat("the line of text é\n", 50)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := ReadText(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Train)+string(c.Heldout) != text || len(c.Heldout) == 0 || len(c.Heldout) > len(text)/5 ||
		!strings.HasSuffix(string(c.Train), "\n") {
		t.Errorf("split %d + %d bytes of %d, training part ends %q", len(c.Train), len(c.Heldout), len(text), c.Train[len(c.Train)-3:])
	}
}

// goroot is this machine's Go tree, the default corpus.
func goroot(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, err := GOROOT(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestGoSourceIsDeterministic: the Go source corpus is the same on every
// read, about the size asked for, about a tenth held out, and Go.
func TestGoSourceIsDeterministic(t *testing.T) {
	root := goroot(t)
	a, err := GoSource(root, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	b, err := GoSource(root, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if string(a.Train) != string(b.Train) || string(a.Heldout) != string(b.Heldout) {
		t.Fatal("two reads of the Go source differ")
	}
	total := len(a.Train) + len(a.Heldout)
	if total < 1<<19 || total > 3<<20 {
		t.Errorf("%d bytes read for a limit of 1 MiB", total)
	}
	if f := float64(len(a.Heldout)) / float64(total); f < 0.03 || f > 0.25 {
		t.Errorf("%.2f of the corpus held out, want about a tenth", f)
	}
	if !strings.Contains(string(a.Train), "package ") || !strings.Contains(string(a.Heldout), "func ") {
		t.Error("the corpus is not Go source")
	}
	empty := t.TempDir()
	if err := os.Mkdir(filepath.Join(empty, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := GoSource(empty, 0); err == nil || !strings.Contains(err.Error(), "no .go files") {
		t.Errorf("a tree without Go source: %v", err)
	}
}

// unigram is the cross-entropy in nats of heldout under the byte
// frequencies of train (add-one smoothed): what a model that ignores
// context can reach.
func unigram(train, heldout []byte) float64 {
	var counts [Vocab]float64
	for _, c := range train {
		counts[c]++
	}
	total := float64(len(train) + Vocab)
	var h float64
	for _, c := range heldout {
		h -= math.Log((counts[c] + 1) / total)
	}
	return h / float64(len(heldout))
}

// TestLearnsBeyondUnigram: a small GPT trained for 300 steps on 1 MiB of
// the Go source has a held-out loss at least 0.7 nats per character
// below the unigram model's cross-entropy on the same split.
func TestLearnsBeyondUnigram(t *testing.T) {
	corpus, err := GoSource(goroot(t), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Width: 32, Depth: 1, Heads: 2, Context: 32}
	m, err := New(cfg, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	opt, err := nn.NewOptimizer(nn.OptimizerConfig{Kind: "adam"}, m.Params())
	if err != nil {
		t.Fatal(err)
	}
	train := &Windows{Text: corpus.Train, Context: cfg.Context}
	const batch, steps = 16, 300
	idx := make([]int, batch)
	var b worker.Batch
	for s := range steps {
		for i := range idx {
			idx[i] = (s*batch*7919 + i*104729) % train.Len()
		}
		if err := train.Fill(idx, &b); err != nil {
			t.Fatal(err)
		}
		nn.ZeroGrads(m.Params())
		if _, err := m.Step(&b, 1./batch, nil); err != nil {
			t.Fatal(err)
		}
		opt.Update(m.Params(), 0.01, int64(s+1))
	}
	test := &Windows{Text: corpus.Heldout, Context: cfg.Context, Limit: 64}
	idx = idx[:0]
	for i := range test.Len() {
		idx = append(idx, i)
	}
	if err := test.Fill(idx, &b); err != nil {
		t.Fatal(err)
	}
	res, err := m.Evaluate(&b)
	if err != nil {
		t.Fatal(err)
	}
	got, base := res.LossSum/float64(len(idx)), Unigram(corpus.Train, test)
	if other := unigram(corpus.Train, corpus.Heldout[1:test.Len()*cfg.Context+1]); math.Abs(other-base) > 1e-9 {
		t.Errorf("Unigram %v, the test's own count %v", base, other)
	}
	t.Logf("held-out %.3f nats/char, unigram %.3f", got, base)
	if got > base-0.7 {
		t.Errorf("held-out loss %.3f nats per character, unigram %.3f: not 0.7 below it", got, base)
	}
}

// TestGenerate: the same seed gives the same text, temperature 0 the
// likeliest characters; a split model and a negative temperature are
// refused.
func TestGenerate(t *testing.T) {
	m, err := New(small, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Generate([]byte("func "), 40, 1, 9)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.Generate([]byte("func "), 40, 1, 9)
	c, _ := m.Generate([]byte("func "), 40, 1, 10)
	if string(a) != string(b) || len(a) != 45 || !strings.HasPrefix(string(a), "func ") {
		t.Errorf("same seed: %q and %q", a, b)
	}
	if string(a) == string(c) {
		t.Errorf("seeds 9 and 10 gave the same %q", a)
	}
	g0, _ := m.Generate([]byte("func "), 12, 0, 1)
	g1, _ := m.Generate([]byte("func "), 12, 0, 2)
	if string(g0) != string(g1) {
		t.Errorf("temperature 0 depends on the seed: %q, %q", g0, g1)
	}
	long := strings.Repeat("x", 3*small.Context)
	if out, err := m.Generate([]byte(long), 5, 0.5, 1); err != nil || len(out) != len(long)+5 {
		t.Errorf("a prompt longer than the context: %d bytes, %v", len(out), err)
	}
	if _, err := m.Generate(nil, 3, -1, 1); err == nil {
		t.Error("temperature -1 accepted")
	}
}

// TestLoadTakesSlices: a split model loaded from the whole model's
// tensors holds their slices, and a whole model their values.
func TestLoadTakesSlices(t *testing.T) {
	src, err := New(small, 11, nil)
	if err != nil {
		t.Fatal(err)
	}
	tensors := map[string][]float32{}
	for _, p := range src.Params() {
		tensors[p.Name] = p.Value
	}
	read := func(name string, dst []float32) error {
		v, ok := tensors[name]
		if !ok || len(v) != len(dst) {
			return fmt.Errorf("no tensor %s of %d", name, len(dst))
		}
		copy(dst, v)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gs, err := collective.InprocGroups(ctx, 2, t.Name(), 1, collective.Options{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer collective.CloseGroups(gs)
	m, err := New(small, 12, tp.NewComm(ctx, gs[1])) // another seed: the values come from Load
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Load(read); err != nil {
		t.Fatal(err)
	}
	for _, s := range m.Slices() {
		part := make([]float32, len(s.Local.Value))
		s.Take(tensors[s.Local.Name], part)
		near(t, s.Local.Name, s.Local.Value, part)
	}
	w, _ := New(small, 12, nil)
	if err := w.Load(read); err != nil {
		t.Fatal(err)
	}
	for _, p := range w.Params() {
		near(t, p.Name, p.Value, tensors[p.Name])
	}
	delete(tensors, "h1.fc2.W")
	if err := w.Load(read); err == nil || !strings.Contains(err.Error(), "h1.fc2.W") {
		t.Errorf("a missing tensor: %v", err)
	}
}

// TestWindowsAndLabels: window i is the Context+1 bytes from i·Context;
// the inputs are its first Context bytes and each label the byte after
// its input.
func TestWindowsAndLabels(t *testing.T) {
	w := &Windows{Text: []byte("abcdefghij"), Context: 3}
	if w.Len() != 3 {
		t.Fatalf("%d windows of 3+1 in 10 bytes, want 3", w.Len())
	}
	b := batchOf(t, "abcdefghij", 3, 2, 0)
	m := &Model{Config: Config{Context: 3}}
	ids, labels, err := m.split(b)
	if err != nil {
		t.Fatal(err)
	}
	str := func(x []int32) string {
		var s []byte
		for _, c := range x {
			s = append(s, byte(c))
		}
		return string(s)
	}
	if str(ids) != "ghiabc" || str(labels) != "hijbcd" {
		t.Errorf("inputs %q, labels %q; want \"ghiabc\", \"hijbcd\"", str(ids), str(labels))
	}
	if err := w.Fill([]int{3}, b); err == nil {
		t.Error("window 3 of 3 filled")
	}
	if _, _, err := m.split(&worker.Batch{N: 2, IDs: make([]int32, 7)}); err == nil {
		t.Error("a batch of 2 windows with 7 ids accepted")
	}
}

// TestGradientsMatchFiniteDifferences: every parameter gradient of a tiny
// GPT (embedding, positions, a block, the final LayerNorm and the head,
// through the loss) against central differences of the loss.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	cfg := Config{Width: 8, Depth: 1, Heads: 2, Context: 4}
	m, err := New(cfg, 5, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Params() { // large enough values that every gradient shows
		for i := range p.Value {
			p.Value[i] = float32(math.Sin(float64(i)*1.7+float64(len(p.Name)))) * 0.5
		}
	}
	b := batchOf(t, sampleText, cfg.Context, 1, 4)
	loss := func() float64 {
		res, err := m.Evaluate(b)
		if err != nil {
			t.Fatal(err)
		}
		return res.LossSum
	}
	nn.ZeroGrads(m.Params())
	if _, err := m.Step(b, 1, nil); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range m.Params() {
		for i := range p.Value {
			if p.Name == "tok.table" || p.Name == "head.W" || p.Name == "head.b" {
				// 256 rows or columns: check the ones the batch touches
				// and a few others
				if i%13 != 0 && p.Grad[i] == 0 {
					continue
				}
			}
			orig := p.Value[i]
			const h = 1e-2
			p.Value[i] = orig + h
			up := loss()
			p.Value[i] = orig - h
			down := loss()
			p.Value[i] = orig
			numeric := (up - down) / (2 * h)
			if d := math.Abs(numeric - float64(p.Grad[i])); d > 2e-3+2e-2*math.Abs(numeric) {
				t.Errorf("%s[%d]: analytic %.6f, numeric %.6f", p.Name, i, p.Grad[i], numeric)
			}
			checked++
		}
	}
	t.Logf("%d gradients checked", checked)
}

// TestSplitStepAllocatesNothing: once warm, a training step of the model
// split across 2 tensor-parallel ranks, with and without sequence
// parallelism, allocates nothing on either rank, its layers' collectives
// over in-process groups included. testing.AllocsPerRun counts the whole
// process: both ranks run on goroutines started once, each step started
// and awaited through channels.
func TestSplitStepAllocatesNothing(t *testing.T) {
	if !strings.HasPrefix(nn.BLAS(), "openblas") {
		if os.Getenv("CI") == "true" {
			t.Fatalf("under CI, on %s: the test needs the openblas build (go test -tags openblas)", nn.BLAS())
		}
		t.Skipf("on %s, whose parallel products allocate; the openblas build checks this", nn.BLAS())
	}
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector; the non-race pass runs this test")
	}
	for _, sp := range []bool{false, true} {
		t.Run(fmt.Sprintf("sequence-parallel=%v", sp), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const size = 2
			gs, err := collective.InprocGroups(ctx, size, t.Name(), 1, collective.Options{Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer collective.CloseGroups(gs)
			b := batchOf(t, sampleText, small.Context, 0, 2, 4)
			cfg := small
			cfg.SequenceParallel = sp
			start, done := make(chan struct{}), make(chan error, size)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer close(start)
			for _, g := range gs {
				m, err := New(cfg, 1, tp.NewComm(ctx, g))
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range start {
						nn.ZeroGrads(m.Params())
						_, err := m.Step(b, 1/3., func(int) {})
						done <- err
					}
				}()
			}
			step := func() {
				for range size {
					start <- struct{}{}
				}
				for range size {
					select {
					case err := <-done:
						if err != nil {
							t.Fatal(err)
						}
					case <-ctx.Done():
						t.Fatal("a split step did not end within a minute")
					}
				}
			}
			step()
			if n := testing.AllocsPerRun(5, step); n != 0 {
				t.Errorf("a warm split step (2 ranks) allocates %v times", n)
			}
		})
	}
}

// TestStepAllocatesNothing: once warm, a training step of the whole model
// allocates nothing (on OpenBLAS: the pure-Go BLAS's parallel products
// allocate for their goroutines, which nn's own test accounts for).
func TestStepAllocatesNothing(t *testing.T) {
	if !strings.HasPrefix(nn.BLAS(), "openblas") {
		if os.Getenv("CI") == "true" { // CI builds with OpenBLAS: this build lost its tag
			t.Fatalf("under CI, on %s: the test needs the openblas build (go test -tags openblas)", nn.BLAS())
		}
		t.Skipf("on %s, whose parallel products allocate; the openblas build checks this", nn.BLAS())
	}
	m, err := New(small, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := batchOf(t, sampleText, small.Context, 0, 2, 4)
	step := func() {
		nn.ZeroGrads(m.Params())
		if _, err := m.Step(b, 1/3., func(int) {}); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if n := testing.AllocsPerRun(5, step); n != 0 {
		t.Errorf("a warm step allocates %v times", n)
	}
}
