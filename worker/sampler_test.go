package worker

import (
	"fmt"
	"testing"
)

// TestSamplerExactlyOnce: every sample exactly once per epoch across ranks,
// for several epochs, on N = 1..7 ranks, and again when the world size
// changes mid-epoch and across an epoch boundary.
func TestSamplerExactlyOnce(t *testing.T) {
	const n, global = 1003, 64 // 16 global batches an epoch, the last of 43
	for world := 1; world <= 7; world++ {
		for _, changeTo := range []int{0, 1, 3, 7} {
			// Step 5 is mid-epoch 0; steps 16 and 17 end epoch 0 and begin
			// epoch 1; step 40 is mid-epoch 2.
			for _, at := range []int{5, 16, 17, 40} {
				s, err := NewSampler(n, 42)
				if err != nil {
					t.Fatal(err)
				}
				worlds := func(step int) int {
					if changeTo > 0 && step >= at {
						return changeTo
					}
					return world
				}
				if err := dealtExactlyOnce(s, global, 4, worlds); err != nil {
					t.Fatalf("world %d, %d from step %d: %v", world, changeTo, at, err)
				}
			}
		}
	}
}

// dealtExactlyOnce deals epochs epochs of global batches from s, on
// worlds(step) ranks at each step (counted from 1), and checks that every
// sample of every epoch went to exactly one rank, that no global batch
// spans two epochs or exceeds global, and that the last one of each epoch
// ends it.
func dealtExactlyOnce(s *Sampler, global, epochs int, worlds func(step int) int) error {
	n := s.Len()
	var pos Position
	for e := range int64(epochs) {
		seen := make([]int, n)
		for step := 1; pos.Epoch == e; step++ {
			w := worlds(step)
			var next Position
			for r := range w {
				idx, size, nx, err := s.Batch(pos, global, w, r, nil)
				if err != nil {
					return err
				}
				if size > global {
					return fmt.Errorf("epoch %d, step %d: a global batch of %d > %d", e, step, size, global)
				}
				for _, i := range idx {
					seen[i]++
				}
				next = nx
			}
			if next.Epoch != e && next != (Position{Epoch: e + 1}) {
				return fmt.Errorf("epoch %d, step %d: the batch ended at %+v, inside the next epoch", e, step, next)
			}
			pos = next
		}
		for i, c := range seen {
			if c != 1 {
				return fmt.Errorf("epoch %d: sample %d dealt %d times", e, i, c)
			}
		}
	}
	return nil
}

// TestSamplerDeterministic: the same seed and epoch give the same order, other
// epochs another.
func TestSamplerDeterministic(t *testing.T) {
	a, _ := NewSampler(100, 7)
	b, _ := NewSampler(100, 7)
	x, _, _, _ := a.Batch(Position{Epoch: 3}, 100, 1, 0, nil)
	y, _, _, _ := b.Batch(Position{Epoch: 3}, 100, 1, 0, nil)
	z, _, _, _ := b.Batch(Position{Epoch: 4}, 100, 1, 0, nil)
	same := true
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("same seed and epoch differ at %d", i)
		}
		same = same && x[i] == z[i]
	}
	if same {
		t.Error("epochs 3 and 4 have the same order")
	}
	if _, _, _, err := a.Batch(Position{Offset: 100}, 10, 1, 0, nil); err == nil {
		t.Error("position past the epoch accepted")
	}
}
