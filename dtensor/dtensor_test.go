package dtensor

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
)

func groups(t *testing.T, n int) []*collective.Group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gs, err := collective.InprocGroups(ctx, n, "dtensor", 1, collective.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { collective.CloseGroups(gs) })
	return gs
}

// logical is the reference tensor: small integers, so that every sum of
// addends is exact in float32.
func logical(shape []int) []float32 {
	x := make([]float32, count(shape))
	for i := range x {
		x[i] = float32((i*7)%23 - 11)
	}
	return x
}

// shardOf is what rank holds of the logical tensor x under p: the block
// of a split, the whole of a replica, and for a partial an addend (the
// others' addends subtracted on the last rank).
func shardOf(x []float32, shape []int, p Placement, size, rank int) []float32 {
	switch p.Kind {
	case KindSplit:
		lo, hi := Range(shape, p.Axis, size, rank)
		b := make([]float32, count(localShape(shape, p, size, rank)))
		block(x, shape, p.Axis, lo, hi, b, true)
		return b
	case KindPartial:
		out := make([]float32, len(x))
		for i, v := range x {
			if rank < size-1 {
				out[i] = float32((i + 3*rank) % 5)
			} else {
				s := float32(0)
				for r := range size - 1 {
					s += float32((i + 3*r) % 5)
				}
				out[i] = v - s
			}
		}
		return out
	}
	return slices.Clone(x)
}

// TestRedistribute: every transition between B, P and S(axis) of every
// axis, on tensors whose lengths the group does not divide (5 × 7, and 3 ×
// 4 × 5), at group sizes 1 to 4, against the single-rank tensor: a split
// or replica shard equals its part of it, and a partial's addends sum to
// it.
func TestRedistribute(t *testing.T) {
	for _, shape := range [][]int{{5, 7}, {3, 4, 5}, {1, 6}} {
		places := []Placement{Replicate(), Partial()}
		for a := range shape {
			places = append(places, Split(a))
		}
		x := logical(shape)
		for size := 1; size <= 4; size++ {
			gs := groups(t, size)
			for _, from := range places {
				for _, to := range places {
					t.Run(fmt.Sprintf("%v/%d/%v-%v", shape, size, from, to), func(t *testing.T) {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						outs := make([]*Tensor, size)
						errs := make([]error, size)
						var wg sync.WaitGroup
						for r, g := range gs {
							wg.Add(1)
							go func() {
								defer wg.Done()
								in := &Tensor{Shape: shape, Place: from, G: g, Local: shardOf(x, shape, from, size, r)}
								outs[r], errs[r] = Redistribute(ctx, in, to)
							}()
						}
						wg.Wait()
						for r, err := range errs {
							if err != nil {
								t.Fatalf("rank %d: %v", r, err)
							}
						}
						if to.Kind == KindPartial {
							sum := make([]float32, len(x))
							for _, o := range outs {
								for i, v := range o.Local {
									sum[i] += v
								}
							}
							if !slices.Equal(sum, x) {
								t.Fatalf("the partial addends sum to %v, want %v", sum, x)
							}
							return
						}
						for r, o := range outs {
							if o.Place != to || !slices.Equal(o.Shape, shape) {
								t.Fatalf("rank %d: a %v tensor of %v, want %v of %v", r, o.Place, o.Shape, to, shape)
							}
							if want := shardOf(x, shape, to, size, r); !slices.Equal(o.Local, want) {
								t.Fatalf("rank %d holds %v, want %v", r, o.Local, want)
							}
						}
					})
				}
			}
		}
	}
}

// TestMatMulSignatures: the SBP rules, and a mismatch named.
func TestMatMulSignatures(t *testing.T) {
	for _, c := range []struct {
		a, b, want Placement
		err        bool
	}{
		{Split(0), Replicate(), Split(0), false},
		{Replicate(), Split(1), Split(1), false},
		{Split(1), Split(0), Partial(), false},
		{Replicate(), Replicate(), Replicate(), false},
		{Partial(), Replicate(), Partial(), false},
		{Replicate(), Partial(), Partial(), false},
		{Split(0), Split(0), Placement{}, true},
		{Split(1), Replicate(), Placement{}, true},
		{Partial(), Partial(), Placement{}, true},
	} {
		got, err := MatMul(c.a, c.b)
		switch {
		case c.err && (err == nil || !strings.Contains(err.Error(), c.a.String()+" × "+c.b.String())):
			t.Errorf("%v × %v: %v, want an error naming both", c.a, c.b, err)
		case !c.err && (err != nil || got != c.want):
			t.Errorf("%v × %v = %v, %v; want %v", c.a, c.b, got, err, c.want)
		}
	}
}

// TestBadTensors: an axis the tensor lacks, a shard of the wrong length
// and a negative length are refused, naming the problem.
func TestBadTensors(t *testing.T) {
	g := groups(t, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		name string
		t    *Tensor
		to   Placement
		want string
	}{
		{"axis", &Tensor{Shape: []int{2, 3}, Place: Replicate(), G: g, Local: make([]float32, 6)}, Split(2), "no axis 2"},
		{"from axis", &Tensor{Shape: []int{2, 3}, Place: Split(-1), G: g, Local: make([]float32, 6)}, Replicate(), "no axis -1"},
		{"length", &Tensor{Shape: []int{2, 3}, Place: Replicate(), G: g, Local: make([]float32, 5)}, Split(0), "holds 5 elements, want 6"},
		{"negative", &Tensor{Shape: []int{2, -3}, Place: Replicate(), G: g}, Partial(), "negative"},
	} {
		if _, err := Redistribute(ctx, c.t, c.to); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := New(g, []int{4}, Split(1)); err == nil {
		t.Errorf("New with a split of a missing axis: no error")
	}
}
