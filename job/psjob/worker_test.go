package psjob

import (
	"slices"
	"testing"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/ps"
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

// TestExactlyOnce: a shard's account is exactly once when every share's
// steps base+1..steps were applied once each: not with a step short, one
// over, or a step lost beside another applied twice (the count even); never
// under asp.
func TestExactlyOnce(t *testing.T) {
	const steps = 10
	once := ps.PushCounts{Last: steps, Applied: steps}
	for _, tc := range []struct {
		name string
		mode ps.Mode
		p    ps.PushCounts
		want bool
	}{
		{"every step once", ps.BSP, once, true},
		{"from a restore", ps.SSP, ps.PushCounts{Last: steps, Applied: steps - 4, Base: 4}, true},
		{"a step short", ps.BSP, ps.PushCounts{Last: steps, Applied: steps - 1, Skipped: 5}, false},
		{"a step twice", ps.BSP, ps.PushCounts{Last: steps, Applied: steps + 1, Again: 5}, false},
		{"lost and twice, the count even", ps.BSP, ps.PushCounts{Last: steps, Applied: steps, Again: 7, Skipped: 3}, false},
		{"the last step missing", ps.BSP, ps.PushCounts{Last: steps - 1, Applied: steps - 1}, false},
		{"asp", ps.ASP, once, false},
	} {
		a := psShardAccount{Info: ps.ShardInfo{Pushes: []ps.PushCounts{once, tc.p}}}
		if got := a.exactlyOnce(tc.mode, steps); got != tc.want {
			t.Errorf("%s: exactly once %v, want %v (%+v)", tc.name, got, tc.want, tc.p)
		}
	}
}
