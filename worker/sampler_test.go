package worker

import "testing"

// TestSamplerExactlyOnce: every sample exactly once per epoch across ranks for
// N = 1..7, and again when the world size changes mid-epoch.
func TestSamplerExactlyOnce(t *testing.T) {
	const n, global = 1003, 64
	for world := 1; world <= 7; world++ {
		for _, changeTo := range []int{0, 1, 3, 7} {
			s, err := NewSampler(n, 42)
			if err != nil {
				t.Fatal(err)
			}
			seen := make([]int, n)
			pos, w := Position{}, world
			for step := 0; pos.Epoch == 0; step++ {
				if step == 5 && changeTo > 0 {
					w = changeTo
				}
				size := 0
				var next Position
				for r := range w {
					var idx []int
					var sz int
					idx, sz, next, err = s.Batch(pos, global, w, r, nil)
					if err != nil {
						t.Fatal(err)
					}
					size = sz
					for _, i := range idx {
						seen[i]++
					}
				}
				if size > global {
					t.Fatalf("global batch of %d > %d", size, global)
				}
				pos = next
			}
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("world %d→%d: sample %d seen %d times", world, changeTo, i, c)
				}
			}
			if pos != (Position{Epoch: 1}) {
				t.Fatalf("ended at %+v", pos)
			}
		}
	}
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
