package ring

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// TestParametersAgree: the check behind the done event's
// parameters_identical says true when every rank holds bitwise the same
// parameters, and false, naming the rank by its checksum, when one rank's
// single value is one ulp off (as the planted bug ParamDrift makes it), or
// when only its last value differs.
func TestParametersAgree(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drift func(rank int, ps []*nn.Param)
		same  bool
		odd   int // the rank whose checksum differs (-1: none)
	}{
		{"identical", func(int, []*nn.Param) {}, true, -1},
		{"rank 2 one ulp off", func(r int, ps []*nn.Param) {
			if r == 2 {
				ps[0].Value[3] = math.Nextafter32(ps[0].Value[3], 1)
			}
		}, false, 2},
		{"rank 0's last value", func(r int, ps []*nn.Param) {
			if r == 0 {
				v := ps[1].Value
				v[len(v)-1] = -v[len(v)-1]
			}
		}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			const world = 4
			net := collective.NewInprocNetwork()
			peers := make([]string, world)
			for r := range peers {
				peers[r] = fmt.Sprint(r)
			}
			var wg sync.WaitGroup
			same := make([]bool, world)
			crcs := make([][]uint32, world)
			errs := make([]error, world)
			for r := range world {
				wg.Add(1)
				go func() {
					defer wg.Done()
					g, err := collective.Join(ctx, net, collective.Membership{Job: "agree", Generation: 1, Rank: r, Peers: peers}, collective.Options{Timeout: time.Minute})
					if err != nil {
						errs[r] = err
						return
					}
					defer g.Close()
					ps := []*nn.Param{{Name: "w", Value: []float32{1, 2, 3, 4.5}}, {Name: "b", Value: []float32{0.25, -7}}}
					tc.drift(r, ps)
					same[r], crcs[r], errs[r] = parametersAgree(ctx, g, ps)
				}()
			}
			wg.Wait()
			for r := range world {
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				if same[r] != tc.same || len(crcs[r]) != world {
					t.Fatalf("rank %d: identical %v with checksums %x, want %v", r, same[r], crcs[r], tc.same)
				}
				for q := range world {
					if crcs[r][q] != crcs[0][q] {
						t.Fatalf("rank %d's checksums %x, rank 0's %x: every rank must learn the same", r, crcs[r], crcs[0])
					}
					ref := crcs[r][(tc.odd+1)%world] // a rank whose parameters are as they should be
					if odd := q == tc.odd; odd == (crcs[r][q] == ref) {
						t.Errorf("rank %d sees checksums %x: want rank %d's alone to differ", r, crcs[r], tc.odd)
					}
				}
			}
		})
	}
}
