package tp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/nn"
)

// block is the unsplit pre-norm block every rank builds alike: 4 heads
// over 8 features, sequences of 3 tokens, every parameter (LayerNorms
// included) drawn N(0, 0.3²) so that none is the identity or negligible.
func block(t *testing.T) *nn.Block {
	t.Helper()
	rng := rand.New(rand.NewPCG(5, 6))
	b, err := nn.NewBlock("blk", 4, 8, 3, 2, rng)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range b.Layers() {
		for _, p := range l.Params() {
			for i := range p.Value {
				p.Value[i] = float32(0.3 * rng.NormFloat64())
			}
		}
	}
	return b
}

// TestBlockEqualsTwin: a whole transformer block cut across T = 1, 2 and 4
// ranks (heads split; the MLP's 32 hidden features split) gives every
// rank the unsplit block's output and input gradient, and each rank's
// slice of every parameter gradient (its Slices) equals that slice of the
// unsplit block's, within 1e-5 relative, over two steps that reuse every
// buffer.
func TestBlockEqualsTwin(t *testing.T) {
	const rows, width = 6, 8 // two sequences of 3
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("T%d", size), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			gs := groups(t, ctx, size)
			ref := nn.NewSequential(block(t).Layers()...)
			type grads struct {
				y, dx  []float32
				slices []Slice
			}
			for step := range 2 {
				x, dy := randMatrix(uint64(30+step), rows, width), randMatrix(uint64(40+step), rows, width)
				nn.ZeroGrads(ref.Params())
				wantY := append([]float32(nil), ref.Forward(x).Data...)
				wantDX := append([]float32(nil), ref.Backward(dy, nil).Data...)
				wantGrad := map[string][]float32{}
				for _, p := range ref.Params() {
					wantGrad[p.Name] = p.Grad
				}
				res := make([]grads, size)
				errs := make([]error, size)
				var wg sync.WaitGroup
				for r, g := range gs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						comm := NewComm(ctx, g)
						layers, err := CutBlock(comm, block(t))
						if err != nil {
							errs[r] = err
							return
						}
						seq := nn.NewSequential(layers...)
						for s := range step + 1 {
							xs, dys := randMatrix(uint64(30+s), rows, width), randMatrix(uint64(40+s), rows, width)
							nn.ZeroGrads(seq.Params())
							y := seq.Forward(xs)
							dx := seq.Backward(dys, nil)
							res[r] = grads{y: append([]float32(nil), y.Data...), dx: append([]float32(nil), dx.Data...)}
						}
						res[r].slices = SlicesOf(layers...)
						errs[r] = comm.Err()
					}()
				}
				wg.Wait()
				for r, err := range errs {
					if err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
				for r, rs := range res {
					p := fmt.Sprintf("step %d, rank %d: ", step, r)
					near(t, p+"output", rs.y, wantY)
					near(t, p+"input gradient", rs.dx, wantDX)
					if len(rs.slices) != len(wantGrad) {
						t.Fatalf("%s%d parameter slices, the block has %d parameters", p, len(rs.slices), len(wantGrad))
					}
					for _, s := range rs.slices {
						if err := s.Check(); err != nil {
							t.Fatal(err)
						}
						want, ok := wantGrad[s.Local.Name]
						if !ok {
							t.Fatalf("%sslice of %s, which the block does not have", p, s.Local.Name)
						}
						whole := strings.Contains(s.Local.Name, ".ln") || s.Local.Name == "blk.proj.b" || s.Local.Name == "blk.fc2.b"
						if split := s.Split(); split != !whole {
							t.Errorf("%s%s split %v at T=%d", p, s.Local.Name, split, size)
						}
						if at := s.At(size, r); s.Split() && (!slices.Equal(at.Ranges, s.Ranges) || at.Len() != len(s.Local.Value)) {
							t.Errorf("%s%s: ranges %v, but BlockRanges gives %v", p, s.Local.Name, s.Ranges, at.Ranges)
						}
						part := make([]float32, len(s.Local.Grad))
						s.Take(want, part)
						near(t, p+s.Local.Name+" gradient (its slice)", s.Local.Grad, part)
					}
				}
			}
		})
	}
}

// TestCutBlockRefusesUnevenHeads: a group that does not divide the heads
// is an error naming both.
func TestCutBlockRefusesUnevenHeads(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gs := groups(t, ctx, 3)
	_, err := CutBlock(NewComm(ctx, gs[0]), block(t))
	if err == nil || !strings.Contains(err.Error(), "4 heads") || !strings.Contains(err.Error(), "3 tensor-parallel ranks") {
		t.Fatalf("CutBlock at T=3 of 4 heads: %v", err)
	}
}

// TestSequenceParallelBlockEqualsTwin: with sequence parallelism (a
// SeqSplit, then the block cut by CutBlockSequenceParallel), each rank's
// output rows equal those rows of the unsplit block's output, the input
// gradient gathered by the SeqSplit equals the unsplit one, and after
// SyncGrads each rank's slice of every parameter gradient equals the
// unsplit block's, at T = 1, 2 and 4 with 6 rows (uneven at T = 4), over
// two steps.
func TestSequenceParallelBlockEqualsTwin(t *testing.T) {
	const rows, width = 6, 8
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprintf("T%d", size), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			gs := groups(t, ctx, size)
			ref := nn.NewSequential(block(t).Layers()...)
			for step := range 2 {
				x, dy := randMatrix(uint64(50+step), rows, width), randMatrix(uint64(60+step), rows, width)
				nn.ZeroGrads(ref.Params())
				wantY := append([]float32(nil), ref.Forward(x).Data...)
				wantDX := append([]float32(nil), ref.Backward(dy, nil).Data...)
				wantGrad := map[string][]float32{}
				for _, p := range ref.Params() {
					wantGrad[p.Name] = p.Grad
				}
				errs := make([]error, size)
				var wg sync.WaitGroup
				for r, g := range gs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[r] = func() error {
							comm := NewComm(ctx, g)
							cut, syncs, err := CutBlockSequenceParallel(comm, block(t))
							if err != nil {
								return err
							}
							seq := nn.NewSequential(append([]nn.Layer{NewSeqSplit(comm)}, cut...)...)
							lo, hi := comm.RowsOf(rows)
							var y, dx nn.Matrix
							for s := range step + 1 {
								xs, dys := randMatrix(uint64(50+s), rows, width), randMatrix(uint64(60+s), rows, width)
								nn.ZeroGrads(seq.Params())
								y = seq.Forward(xs)
								dx = seq.Backward(nn.Matrix{Rows: hi - lo, Cols: width, Data: dys.Data[lo*width : hi*width]}, nil)
								comm.SyncGrads(syncs)
							}
							if err := comm.Err(); err != nil {
								return err
							}
							p := fmt.Sprintf("step %d, rank %d: ", step, r)
							near(t, p+"output rows", y.Data, wantY[lo*width:hi*width])
							near(t, p+"input gradient", dx.Data, wantDX)
							slices := SlicesOf(cut...)
							if len(slices) != len(wantGrad) {
								return fmt.Errorf("%s%d parameter slices, the block has %d parameters", p, len(slices), len(wantGrad))
							}
							for _, s := range slices {
								part := make([]float32, len(s.Local.Grad))
								s.Take(wantGrad[s.Local.Name], part)
								near(t, p+s.Local.Name+" gradient (its slice)", s.Local.Grad, part)
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
			}
		})
	}
}
