package collective

import (
	"testing"
)

// TestAllReduceTensors: fused buckets give the same bits as one allreduce per
// tensor, for layouts with small tensors, one tensor larger than a bucket, and
// empty tensors.
func TestAllReduceTensors(t *testing.T) {
	sizes := []int{3, 100, 0, 5000, 7, 1, 40000, 12, 12}
	groups := inprocGroups(t, 3, 1, Options{})
	ctx := testContext(t)
	fused := make([][][]float32, len(groups))
	single := make([][][]float32, len(groups))
	for r := range groups {
		for i, n := range sizes {
			x := randomInput[float32](r, n, uint64(i))
			fused[r] = append(fused[r], x)
			single[r] = append(single[r], append([]float32(nil), x...))
		}
	}
	mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
		if err := AllReduceTensors(ctx, g, fused[r], Sum, 64<<10); err != nil {
			return err
		}
		for _, x := range single[r] {
			if err := g.AllReduceWith(ctx, Float32s(x), Sum, AlgoRing); err != nil {
				return err
			}
		}
		return nil
	}))
	for r := range groups {
		for i := range sizes {
			want := reference([][]float32{randomInput[float32](0, sizes[i], uint64(i)), randomInput[float32](1, sizes[i], uint64(i)), randomInput[float32](2, sizes[i], uint64(i))}, Sum)
			for j, v := range fused[r][i] {
				if d := float64(v) - want[j]; d > 1e-4 || d < -1e-4 {
					t.Fatalf("rank %d tensor %d element %d: %v, want %v", r, i, j, v, want[j])
				}
				if fused[0][i][j] != v {
					t.Fatalf("rank %d tensor %d element %d differs from rank 0", r, i, j)
				}
			}
		}
	}
}

// TestFuserOverlap: a bucket is reduced while later tensors are not yet ready
// (bucket 0 completes before the last tensor is marked).
func TestFuserOverlap(t *testing.T) {
	groups := inprocGroups(t, 2, 1, Options{})
	ctx := testContext(t)
	mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
		ts := [][]float64{{1, 2}, {3}, {4, 5, 6}}
		f := NewFuser(ctx, g, ts, Sum, 16) // two float64 per bucket: [0] [1] [2]
		defer f.Close()
		if f.Buckets() != 3 {
			t.Errorf("%d buckets, want 3", f.Buckets())
		}
		if err := f.MarkReady(0); err != nil {
			return err
		}
		if err := f.WaitBucket(ctx, 0); err != nil { // done with tensors 1 and 2 still pending
			return err
		}
		if ts[0][0] != 2 || ts[0][1] != 4 {
			t.Errorf("bucket 0 = %v", ts[0])
		}
		f.MarkReady(2) // out of order: waits for bucket 1
		f.MarkReady(1)
		if err := f.Wait(ctx); err != nil {
			return err
		}
		if ts[1][0] != 6 || ts[2][2] != 12 {
			t.Errorf("got %v", ts)
		}
		return nil
	}))
}

// TestFuserRounds: a Fuser is reused across steps; misuse is an error, not a
// corrupted bucket.
func TestFuserRounds(t *testing.T) {
	groups := inprocGroups(t, 2, 1, Options{})
	ctx := testContext(t)
	mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
		ts := [][]float32{{1, 2}, {3}, {4, 5, 6}}
		f := NewFuser(ctx, g, ts, Sum, 12) // buckets: [0,1] [2]
		defer f.Close()
		for round := range 3 {
			if round > 0 {
				f.Reset()
			}
			if err := f.WaitBucket(ctx, 1); err == nil {
				t.Errorf("round %d: waiting for a bucket not launched succeeded", round)
			}
			for i := range ts {
				if err := f.MarkReady(i); err != nil {
					return err
				}
			}
			if err := f.MarkReady(1); err == nil {
				t.Errorf("round %d: marking tensor 1 twice succeeded", round)
			}
			if err := f.Wait(ctx); err != nil {
				return err
			}
			if err := f.Wait(ctx); err != nil { // a second wait is harmless
				return err
			}
		}
		if want := float32(1 << 3); ts[0][0] != want || ts[2][2] != 6*want {
			t.Errorf("after 3 rounds got %v", ts)
		}
		return nil
	}))
}
