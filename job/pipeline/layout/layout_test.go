package layout

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// at is a member that trained in generation gen as stage s of replica q,
// its last step step.
func at(q, s int, gen uint64, step int64) Member { return Member{q, s, gen, step} }

// nc is a newcomer.
var nc = Member{-1, -1, 0, 0}

func pl(q, s int) Place { return Place{q, s} }

var sp = Spare

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []Member
		stages  int
		want    int
		places  []Place
		kept    []bool
		donor   int
		step    int64
		dropped []int
		formed  []int
	}{
		{
			name:    "first generation: rank r in replica r/P, stage r%P, leftover spare",
			members: []Member{nc, nc, nc, nc, nc},
			stages:  2, want: 4,
			places: []Place{pl(0, 0), pl(0, 1), pl(1, 0), pl(1, 1), sp},
			kept:   []bool{false, false}, donor: -1, formed: []int{0, 1},
		},
		{
			name:    "first generation: want limits the replicas",
			members: []Member{nc, nc, nc, nc, nc, nc, nc},
			stages:  3, want: 1,
			places: []Place{pl(0, 0), pl(0, 1), pl(0, 2), sp, sp, sp, sp},
			kept:   []bool{false}, donor: -1, formed: []int{0},
		},
		{
			name:    "D=2 P=2: stage 0 of replica 1 lost: replica 0 donor, replica 1 dropped, its survivor spare",
			members: []Member{at(0, 0, 5, 100), at(0, 1, 5, 100), at(1, 1, 5, 100)},
			stages:  2, want: 2,
			places: []Place{pl(0, 0), pl(0, 1), sp},
			kept:   []bool{true}, donor: 0, step: 100, dropped: []int{1},
		},
		{
			name: "then a newcomer joins: the spare (its place stale) and the newcomer form replica 1 by rank",
			members: []Member{at(0, 0, 6, 150), at(0, 1, 6, 150),
				at(1, 1, 5, 100), nc},
			stages: 2, want: 2,
			places: []Place{pl(0, 0), pl(0, 1), pl(1, 0), pl(1, 1)},
			kept:   []bool{true, false}, donor: 0, step: 150, formed: []int{1},
		},
		{
			name: "loss and a newcomer in one generation: the survivor keeps its stage in the re-formed replica",
			members: []Member{at(0, 0, 5, 100), at(0, 1, 5, 100),
				nc, at(1, 1, 5, 100)},
			stages: 2, want: 2,
			places: []Place{pl(0, 0), pl(0, 1), pl(1, 0), pl(1, 1)},
			kept:   []bool{true, false}, donor: 0, step: 100, dropped: []int{1}, formed: []int{1},
		},
		{
			name:    "D=1 P=2: stage 1 lost, a newcomer replaces it: nothing kept, survivor keeps stage 0",
			members: []Member{at(0, 0, 3, 50), nc},
			stages:  2, want: 1,
			places: []Place{pl(0, 0), pl(0, 1)},
			kept:   []bool{false}, donor: -1, step: 50, dropped: []int{0}, formed: []int{0},
		},
		{
			name:    "D=1 P=2: stage 0 lost, two newcomers: the survivor is taken first and keeps stage 1",
			members: []Member{nc, nc, at(0, 1, 3, 50)},
			stages:  2, want: 1,
			places: []Place{pl(0, 0), sp, pl(0, 1)},
			kept:   []bool{false}, donor: -1, step: 50, dropped: []int{0}, formed: []int{0},
		},
		{
			name:    "survivors are taken by old replica, then stage, not by rank",
			members: []Member{at(2, 0, 3, 50), at(0, 1, 3, 50), at(1, 0, 3, 50)},
			stages:  2, want: 1,
			places: []Place{sp, pl(0, 1), pl(0, 0)},
			kept:   []bool{false}, donor: -1, step: 50, dropped: []int{0, 1, 2}, formed: []int{0},
		},
		{
			name:    "stages are claimed before the lowest free one is handed out",
			members: []Member{at(0, 1, 2, 10), at(1, 1, 2, 10), at(2, 0, 2, 10)},
			stages:  3, want: 1,
			places: []Place{pl(0, 1), pl(0, 2), pl(0, 0)},
			kept:   []bool{false}, donor: -1, step: 10, dropped: []int{0, 1, 2}, formed: []int{0},
		},
		{
			name:    "D=2 P=2: both stages of replica 1 lost, two newcomers form it",
			members: []Member{at(0, 0, 4, 80), nc, at(0, 1, 4, 80), nc},
			stages:  2, want: 2,
			places: []Place{pl(0, 0), pl(1, 0), pl(0, 1), pl(1, 1)},
			kept:   []bool{true, false}, donor: 0, step: 80, formed: []int{1},
		},
		{
			name: "complete replicas at different steps: only the highest kept, the other re-formed",
			members: []Member{at(0, 0, 5, 101), at(0, 1, 5, 101), at(1, 0, 5, 100),
				at(1, 1, 5, 100), at(2, 0, 5, 101), at(2, 1, 5, 101)},
			stages: 2, want: 3,
			places: []Place{pl(0, 0), pl(0, 1), pl(2, 0), pl(2, 1), pl(1, 0), pl(1, 1)},
			kept:   []bool{true, true, false}, donor: 0, step: 101, dropped: []int{1}, formed: []int{2},
		},
		{
			name: "a torn replica (same Gen, different Steps) is not kept",
			members: []Member{at(0, 0, 5, 100), at(0, 1, 5, 100),
				at(1, 0, 5, 100), at(1, 1, 5, 101)},
			stages: 2, want: 2,
			places: []Place{pl(0, 0), pl(0, 1), pl(1, 0), pl(1, 1)},
			kept:   []bool{true, false}, donor: 0, step: 100, dropped: []int{1}, formed: []int{1},
		},
		{
			name:    "the only replica torn: nothing kept, Step the highest stated",
			members: []Member{at(0, 0, 5, 100), at(0, 1, 5, 101)},
			stages:  2, want: 1,
			places: []Place{pl(0, 0), pl(0, 1)},
			kept:   []bool{false}, donor: -1, step: 101, dropped: []int{0}, formed: []int{0},
		},
		{
			name: "want below the complete replicas: the extra one is free, and spare",
			members: []Member{at(0, 0, 5, 100), at(0, 1, 5, 100), at(1, 0, 5, 100),
				at(1, 1, 5, 100), at(2, 0, 5, 100), at(2, 1, 5, 100)},
			stages: 2, want: 2,
			places: []Place{pl(0, 0), pl(0, 1), pl(1, 0), pl(1, 1), sp, sp},
			kept:   []bool{true, true}, donor: 0, step: 100, dropped: []int{2},
		},
		{
			name:    "kept replicas are renumbered in order of their old numbers",
			members: []Member{at(7, 1, 9, 30), at(3, 0, 9, 30), at(7, 0, 9, 30), at(3, 1, 9, 30)},
			stages:  2, want: 5,
			places: []Place{pl(1, 1), pl(0, 0), pl(1, 0), pl(0, 1)},
			kept:   []bool{true, true}, donor: 0, step: 30,
		},
		{
			name:    "a statement of an older generation is no place",
			members: []Member{at(0, 0, 5, 100), at(0, 1, 4, 100)},
			stages:  2, want: 1,
			places: []Place{pl(0, 0), pl(0, 1)},
			kept:   []bool{false}, donor: -1, step: 100, dropped: []int{0}, formed: []int{0},
		},
		{
			name:    "an older generation's place is no conflict",
			members: []Member{at(0, 0, 5, 100), at(0, 1, 5, 100), at(0, 1, 4, 60)},
			stages:  2, want: 2,
			places: []Place{pl(0, 0), pl(0, 1), sp},
			kept:   []bool{true}, donor: 0, step: 100,
		},
		{
			name:    "P=1: every member is a replica, complete ones kept",
			members: []Member{nc, at(0, 0, 2, 7), at(1, 0, 2, 6)},
			stages:  1, want: 3,
			places: []Place{pl(2, 0), pl(0, 0), pl(1, 0)},
			kept:   []bool{true, false, false}, donor: 0, step: 7, dropped: []int{1}, formed: []int{1, 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lay, err := Plan(tc.members, tc.stages, tc.want)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if lay.Stages != tc.stages || !slices.Equal(lay.Places, tc.places) || !slices.Equal(lay.Kept, tc.kept) ||
				lay.Donor != tc.donor || lay.Step != tc.step ||
				!slices.Equal(lay.Dropped, tc.dropped) || !slices.Equal(lay.Formed, tc.formed) {
				t.Errorf("Plan = %+v\nwant Places %v Kept %v Donor %d Step %d Dropped %v Formed %v",
					lay, tc.places, tc.kept, tc.donor, tc.step, tc.dropped, tc.formed)
			}
			if err := invariants(tc.members, tc.stages, tc.want, lay); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestPlanErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []Member
		stages  int
		want    int
		errs    []string // each in the error
	}{
		{"no stages", []Member{nc}, 0, 1, []string{"stages = 0"}},
		{"no replicas wanted", []Member{nc}, 1, 0, []string{"want = 0"}},
		{"no members", nil, 2, 1, []string{"no members"}},
		{"duplicate place", []Member{at(0, 1, 5, 1), nc, at(0, 1, 5, 1), at(0, 0, 5, 1)}, 2, 1,
			[]string{"ranks 0, 2 all state generation 5 replica 0 stage 1"}},
		{"stage out of range", []Member{at(0, 0, 5, 1), at(0, 2, 5, 1)}, 2, 1,
			[]string{"rank 1 states stage 2, out of range [0, 2)"}},
		{"negative stage", []Member{at(0, 0, 5, 1), at(0, -3, 5, 1)}, 2, 1,
			[]string{"rank 1 states stage -3"}},
		{"negative replica", []Member{at(-2, 0, 5, 1), nc}, 2, 1,
			[]string{"rank 0 states replica -2"}},
		{"every corrupt statement named", []Member{at(0, 5, 3, 1), at(1, 0, 3, 1), at(1, 0, 3, 1), at(1, 0, 3, 1)}, 2, 1,
			[]string{"rank 0 states stage 5", "ranks 1, 2, 3 all state generation 3 replica 1 stage 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Plan(tc.members, tc.stages, tc.want)
			if err == nil {
				t.Fatalf("Plan: no error, want one containing %q", tc.errs)
			}
			for _, e := range tc.errs {
				if !strings.Contains(err.Error(), e) {
					t.Errorf("Plan: %v, want it to contain %q", err, e)
				}
			}
			var few *TooFewError
			if errors.As(err, &few) {
				t.Errorf("Plan: %v is a TooFewError", err)
			}
		})
	}
}

func TestTooFew(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []Member
		stages  int
	}{
		{"one newcomer, two stages", []Member{nc}, 2},
		{"two survivors, four stages", []Member{at(0, 0, 3, 9), at(0, 3, 3, 9)}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Plan(tc.members, tc.stages, 3)
			var few *TooFewError
			if !errors.As(err, &few) {
				t.Fatalf("Plan: %v, want a *TooFewError", err)
			}
			if few.Members != len(tc.members) || few.Stages != tc.stages {
				t.Errorf("TooFewError = %+v, want Members %d Stages %d", *few, len(tc.members), tc.stages)
			}
			want := fmt.Sprintf("%d members, but a replica of %d stages needs %d", len(tc.members), tc.stages, tc.stages)
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Plan: %v, want it to contain %q", err, want)
			}
		})
	}
}

// invariants checks lay against the rules without reproducing Plan: the
// places are a partition, the kept replicas are exactly the first want
// complete replicas at the highest Step, as many replicas are formed as
// the members allow, and formed replicas give old stages back.
func invariants(ms []Member, p, want int, lay Layout) error {
	if lay.Stages != p || len(lay.Places) != len(ms) {
		return fmt.Errorf("Stages %d, %d places for %d members", lay.Stages, len(lay.Places), len(ms))
	}
	d := len(lay.Ranks)
	if d > want || len(lay.Kept) != d {
		return fmt.Errorf("%d replicas (Kept %v), want at most %d", d, lay.Kept, want)
	}
	spares := 0
	for r, pl := range lay.Places {
		if pl == Spare {
			spares++
			continue
		}
		if pl.Replica < 0 || pl.Replica >= d || pl.Stage < 0 || pl.Stage >= p || lay.Ranks[pl.Replica][pl.Stage] != r {
			return fmt.Errorf("rank %d placed at %v, but Ranks = %v", r, pl, lay.Ranks)
		}
	}
	for q, row := range lay.Ranks {
		if len(row) != p {
			return fmt.Errorf("replica %d has %d stages, want %d", q, len(row), p)
		}
		for s, r := range row {
			if r < 0 || r >= len(ms) || lay.Places[r] != (Place{q, s}) {
				return fmt.Errorf("Ranks[%d][%d] = %d, but Places = %v", q, s, r, lay.Places)
			}
		}
	}
	if spares >= p && d != want {
		return fmt.Errorf("%d replicas and %d spares of %d stages, want %d replicas", d, spares, p, want)
	}

	// The complete replicas of the newest generation, by old number.
	var g uint64
	for _, m := range ms {
		g = max(g, m.Gen)
	}
	holders := map[int][]int{} // old replica → ranks
	for r, m := range ms {
		if m.Gen == g && m.Replica >= 0 && m.Stage >= 0 {
			holders[m.Replica] = append(holders[m.Replica], r)
		}
	}
	var olds []int
	steps := map[int]int64{}
	for q, rs := range holders {
		olds = append(olds, q)
		same := len(rs) == p
		for _, r := range rs {
			same = same && ms[r].Step == ms[rs[0]].Step
		}
		if same {
			steps[q] = ms[rs[0]].Step
		}
	}
	slices.Sort(olds)
	var top int64
	first := true
	for _, st := range steps {
		if first || st > top {
			top, first = st, false
		}
	}
	var keep []int
	for _, q := range olds {
		if st, ok := steps[q]; ok && st == top && len(keep) < want {
			keep = append(keep, q)
		}
	}
	for i, k := range lay.Kept {
		if k != (i < len(keep)) {
			return fmt.Errorf("Kept = %v, want the first %d (old replicas %v)", lay.Kept, len(keep), keep)
		}
	}
	for i, q := range keep {
		for _, r := range holders[q] {
			if lay.Places[r] != (Place{i, ms[r].Stage}) {
				return fmt.Errorf("rank %d of kept old replica %d placed at %v, want %v", r, q, lay.Places[r], Place{i, ms[r].Stage})
			}
		}
	}
	maxStep := ms[0].Step
	for _, m := range ms {
		maxStep = max(maxStep, m.Step)
	}
	switch {
	case len(keep) > 0 && (lay.Donor != 0 || lay.Step != top):
		return fmt.Errorf("Donor %d Step %d, want 0 and %d", lay.Donor, lay.Step, top)
	case len(keep) == 0 && (lay.Donor != -1 || lay.Step != maxStep):
		return fmt.Errorf("Donor %d Step %d, want -1 and %d", lay.Donor, lay.Step, maxStep)
	}
	// In a formed replica, a stage that some member with a place held is
	// held by one such member.
	for q := len(keep); q < d; q++ {
		for _, r := range lay.Ranks[q] {
			m := ms[r]
			if m.Gen != g || m.Replica < 0 || m.Stage < 0 {
				continue
			}
			if h := ms[lay.Ranks[q][m.Stage]]; h.Gen != g || h.Replica < 0 || h.Stage != m.Stage {
				return fmt.Errorf("rank %d held stage %d, but formed replica %d gives it to rank %d (%+v)", r, m.Stage, q, lay.Ranks[q][m.Stage], h)
			}
		}
	}
	var dropped, formed []int
	for _, q := range olds {
		if !slices.Contains(keep, q) {
			dropped = append(dropped, q)
		}
	}
	for i := len(keep); i < d; i++ {
		formed = append(formed, i)
	}
	if !slices.Equal(lay.Dropped, dropped) || !slices.Equal(lay.Formed, formed) {
		return fmt.Errorf("Dropped %v Formed %v, want %v and %v", lay.Dropped, lay.Formed, dropped, formed)
	}
	return nil
}

// random returns the statements of a random generation: up to 3 previous
// replicas (numbered with gaps) of P ≤ 4 stages at one of two steps, some
// stages lost, some torn, some stale, newcomers added, shuffled and cut to
// at most 12 members.
func random(rng *rand.Rand) ([]Member, int, int) {
	p, want, g := 1+rng.IntN(4), 1+rng.IntN(4), uint64(1+rng.IntN(3))
	var ms []Member
	for q := range rng.IntN(4) {
		old, step := 2*q+rng.IntN(2), int64(100+rng.IntN(2))
		for s := range p {
			if rng.IntN(6) == 0 {
				continue // lost
			}
			m := at(old, s, g, step)
			switch rng.IntN(12) {
			case 0:
				m.Step++ // torn
			case 1:
				m.Gen-- // stale
			}
			ms = append(ms, m)
		}
	}
	for range rng.IntN(6) {
		ms = append(ms, nc)
	}
	rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
	return ms[:min(len(ms), 12)], p, want
}

func TestPlanProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kept, formed, few := 0, 0, 0
	for i := range 5000 {
		ms, p, want := random(rng)
		lay, err := Plan(ms, p, want)
		if len(ms) == 0 {
			if err == nil {
				t.Fatalf("case %d: Plan(no members) = %+v, want an error", i, lay)
			}
			continue
		}
		var tf *TooFewError
		if len(ms) < p {
			if !errors.As(err, &tf) {
				t.Fatalf("case %d: Plan(%v, %d, %d): %v, want a *TooFewError", i, ms, p, want, err)
			}
			few++
			continue
		}
		if err != nil {
			t.Fatalf("case %d: Plan(%v, %d, %d): %v", i, ms, p, want, err)
		}
		again, err := Plan(slices.Clone(ms), p, want)
		if err != nil || !reflect.DeepEqual(lay, again) {
			t.Fatalf("case %d: Plan(%v, %d, %d) not deterministic: %+v, then %+v (%v)", i, ms, p, want, lay, again, err)
		}
		if err := invariants(ms, p, want, lay); err != nil {
			t.Fatalf("case %d: Plan(%v, %d, %d) = %+v: %v", i, ms, p, want, lay, err)
		}
		if lay.Donor >= 0 {
			kept++
		}
		if len(lay.Formed) > 0 {
			formed++
		}
	}
	t.Logf("%d cases with a donor, %d forming replicas, %d too few", kept, formed, few)
	if kept < 500 || formed < 500 || few < 100 {
		t.Errorf("the random cases reach too few outcomes: %d with a donor, %d forming, %d too few", kept, formed, few)
	}
}
