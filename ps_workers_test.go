package phalanx

import (
	"slices"
	"testing"

	"github.com/phalanx-rt/phalanx/coordinator"
)

// TestSharesToTake: a worker claims the shares whose worker died (claimed
// once, claim gone, not done), and those nobody ever claimed only after the
// grace; never a share it runs, one claimed, or one done.
func TestSharesToTake(t *testing.T) {
	claim := func(shares ...int) map[int]coordinator.PSShareClaim {
		m := map[int]coordinator.PSShareClaim{}
		for _, s := range shares {
			m[s] = coordinator.PSShareClaim{Share: s}
		}
		return m
	}
	seen := func(shares ...int) map[int]bool {
		m := map[int]bool{}
		for _, s := range shares {
			m[s] = true
		}
		return m
	}
	done := func(shares ...int) map[int]coordinator.PSShareDone {
		m := map[int]coordinator.PSShareDone{}
		for _, s := range shares {
			m[s] = coordinator.PSShareDone{Share: s}
		}
		return m
	}
	cases := []struct {
		name    string
		table   coordinator.PSShares
		running map[int]bool
		grace   bool
		want    []int
	}{
		{"all claimed", coordinator.PSShares{Claims: claim(0, 1, 2), Seen: seen(0, 1, 2), Done: done()}, seen(0), false, nil},
		{"one died", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 1, 2), Done: done()}, seen(0), false, []int{1}},
		{"one died after its share was done", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 1, 2), Done: done(1)}, seen(0), false, nil},
		{"not started yet", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 2), Done: done()}, seen(0), false, nil},
		{"never started, grace over", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 2), Done: done()}, seen(0), true, []int{1}},
		{"this worker's own, between claim and run", coordinator.PSShares{Claims: claim(2), Seen: seen(0, 2), Done: done()}, seen(0), false, nil},
		{"two died", coordinator.PSShares{Claims: claim(0), Seen: seen(0, 1, 2), Done: done()}, seen(0), false, []int{1, 2}},
	}
	for _, tc := range cases {
		if got := sharesToTake(tc.table, 3, tc.running, tc.grace); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
