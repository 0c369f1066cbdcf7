package collective

import (
	"fmt"
	"strings"
	"testing"
)

// TestReduceScatterRanges: every rank keeps its range of the sum, ranges
// of any sizes (empty among them), at group sizes 1 to 4; cuts that do
// not fit are refused.
func TestReduceScatterRanges(t *testing.T) {
	for world := 1; world <= 4; world++ {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			ctx := testContext(t)
			groups := inprocGroups(t, world, 1, Options{})
			parts := make([]int, world)
			for r := range parts {
				parts[r] = (2*r + 3) % 4 // 3, 1, 3, 1: and 0 nowhere; a zero below
			}
			if world > 2 {
				parts[1] = 0
			}
			cuts := a2aCuts(parts)
			n := cuts[world]
			errs := onEveryRank(groups, func(r int, g *Group) error {
				in := make([]float32, n)
				for i := range in {
					in[i] = float32(100*r + i)
				}
				out := make([]float32, parts[r])
				if err := g.ReduceScatterRanges(ctx, Float32s(in), cuts, Float32s(out), Sum); err != nil {
					return err
				}
				for k, v := range out {
					i := cuts[r] + k
					want := float32(0)
					for p := range world {
						want += float32(100*p + i)
					}
					if v != want {
						return fmt.Errorf("element %d: %v, want %v", i, v, want)
					}
				}
				return nil
			})
			mustAll(t, errs)
		})
	}
	g := inprocGroups(t, 1, 1, Options{})[0]
	x := make([]float32, 4)
	if err := g.ReduceScatterRanges(testContext(t), Float32s(x), []int{0, 3}, Float32s(x[:3]), Sum); err == nil || !strings.Contains(err.Error(), "cuts") {
		t.Errorf("cuts short of the input: %v", err)
	}
}
