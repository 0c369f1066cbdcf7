// Package layout places a pipeline job's workers into replicas and stages
// at the start of each generation. A job trains D data-parallel replicas of
// a P-stage pipeline, one worker per (replica, stage). When a worker dies or
// joins, the coordinator starts a new generation listing the live members
// in rank order; each member states where it was in the generation it last
// trained in (a Member), and every member calls Plan on the same statements
// to compute the same Layout. Plan is a pure function: no I/O, no clock, no
// randomness, and no result depends on map iteration order.
//
// Plan applies these rules, in order:
//
//  1. Only statements of the newest previous generation count as places.
//     G is the largest Gen any member states; a member stating Gen < G, or
//     Replica or Stage -1, has no place (it is a newcomer or a spare, and
//     its older place says nothing about the current parameters). A
//     statement that is out of range (Replica or Stage below -1, Stage ≥
//     the stage count) or that claims the same (G, Replica, Stage) as
//     another member's is corrupt: Plan returns an error naming the ranks.
//  2. A previous replica q is complete when members at Gen G hold every
//     one of its stages 0..P-1 and all of them state the same Step. A
//     replica whose members state different Steps is torn (some stages
//     finished a step's optimizer update and others did not, say because a
//     peer died mid-step); its stages hold parameters of different steps
//     that together are no step's model, so it is not complete.
//  3. Only the complete replicas at the highest Step among them can be
//     kept: one behind the others is stale, and its members are free (they
//     receive the donor's parameters like newcomers).
//  4. Those replicas are kept in increasing order of q, at most want of
//     them, renumbered 0, 1, ...; each member of a kept replica keeps its
//     Stage. The rest of them are free.
//  5. Donor is 0 (the first kept replica) when any is kept, and Step is the
//     kept replicas' Step. Otherwise Donor is -1 (the job must restore) and
//     Step is the highest Step any member states.
//  6. The free members (newcomers, stale or torn or incomplete replicas'
//     survivors, complete replicas not kept) form new replicas, numbered
//     after the kept ones, while there are fewer than want replicas and at
//     least P free members remain. Free members are taken in this order:
//     first those with a place (rule 1), by old Replica and then Stage;
//     then those without, by rank. The next P of them form a replica: first,
//     in that order, each member with a place takes its old Stage if no
//     earlier member of the group took it; then, in that order, each other
//     member takes the lowest stage still unfilled. (When nothing is kept
//     the survivors restore their own stage's state, so keeping their
//     stages matters then; the rule applies always, deterministic either
//     way.)
//  7. Members left over are Spare.
//  8. Dropped lists, increasing, the replica numbers of generation G that
//     some member stated and that are not kept; Formed lists, increasing,
//     the new replicas that are not kept (they need parameters).
//
// Plan's errors: fewer than 1 stage, want below 1, no members, corrupt
// statements (rule 1), and fewer members than stages, which is a
// *TooFewError (no replica can be formed; the caller waits as a spare).
package layout

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Member is what a worker states at a generation's start.
type Member struct {
	// Replica and Stage are its place in the generation it last trained
	// in; -1, -1 when it had none (a newcomer, or a spare).
	Replica, Stage int
	// Gen is that generation's number (0 for a newcomer); Step the last
	// step it completed there (its parameters are those after Step).
	Gen  uint64
	Step int64
}

// Place is a worker's place in the new layout; Spare when it has none.
type Place struct{ Replica, Stage int }

// Spare is the Place of a worker in no replica.
var Spare = Place{-1, -1}

// Layout is a generation's placement.
type Layout struct {
	// Stages is the pipeline's stage count P.
	Stages int
	// Places is each rank's place, by rank.
	Places []Place
	// Ranks is each replica's ranks by stage: Ranks[replica][stage] is a
	// rank.
	Ranks [][]int
	// Kept is, per replica, whether it is a previous generation's replica
	// whose every stage survived (in the same places, at the same Step and
	// Gen): its state is current. Kept replicas come first.
	Kept []bool
	// Donor is a kept replica whose parameters the others receive (-1:
	// none is kept; the job must restore).
	Donor int
	// Step is the kept replicas' step (the step the job goes on from) when
	// Donor ≥ 0; otherwise the highest Step any member states
	// (informational).
	Step int64
	// Dropped are the previous generation's replicas (their old numbers)
	// that some member stated and that are not kept, increasing.
	Dropped []int
	// Formed are the new replicas (new numbers) that are not kept and need
	// parameters, increasing.
	Formed []int
}

// TooFewError is Plan's error when there are fewer members than stages, so
// no replica can be formed; the members wait as spares for more to join.
type TooFewError struct {
	Members int // how many members the generation has
	Stages  int // how many a replica needs
}

// Error says how many members there are and how many a replica needs.
func (e *TooFewError) Error() string {
	return fmt.Sprintf("layout: %d members, but a replica of %d stages needs %d", e.Members, e.Stages, e.Stages)
}

// Plan places members (by rank) into at most want replicas of stages
// stages, following the rules of the package comment. Its errors name the
// problem: a bad stages or want, no members, corrupt statements (naming the
// ranks), or a *TooFewError.
func Plan(members []Member, stages, want int) (Layout, error) {
	if stages < 1 {
		return Layout{}, fmt.Errorf("layout: stages = %d, want ≥ 1", stages)
	}
	if want < 1 {
		return Layout{}, fmt.Errorf("layout: want = %d replicas, want ≥ 1", want)
	}
	if len(members) == 0 {
		return Layout{}, errors.New("layout: no members")
	}
	var g uint64
	for _, m := range members {
		g = max(g, m.Gen)
	}
	placed := func(m Member) bool { return m.Gen == g && m.Replica >= 0 && m.Stage >= 0 }
	if err := check(members, stages, g, placed); err != nil {
		return Layout{}, err
	}
	if len(members) < stages {
		return Layout{}, &TooFewError{Members: len(members), Stages: stages}
	}

	// The previous replicas, in increasing order of their number, each
	// with its ranks by stage (-1 where no member holds the stage).
	type old struct {
		q     int
		ranks []int
	}
	var olds []old
	find := func(q int) int {
		i, ok := slices.BinarySearchFunc(olds, q, func(o old, q int) int { return o.q - q })
		if !ok {
			ranks := make([]int, stages)
			for s := range ranks {
				ranks[s] = -1
			}
			olds = slices.Insert(olds, i, old{q, ranks})
		}
		return i
	}
	for r, m := range members {
		if placed(m) {
			olds[find(m.Replica)].ranks[m.Stage] = r
		}
	}

	// Rules 2 and 3: the complete replicas at the highest Step.
	complete := func(o old) bool {
		for _, r := range o.ranks {
			if r < 0 || members[r].Step != members[o.ranks[0]].Step {
				return false
			}
		}
		return true
	}
	var best int64
	found := false
	for _, o := range olds {
		if complete(o) {
			if st := members[o.ranks[0]].Step; !found || st > best {
				best = st
			}
			found = true
		}
	}

	lay := Layout{Stages: stages, Places: make([]Place, len(members)), Donor: -1}
	for r := range lay.Places {
		lay.Places[r] = Spare
	}
	free := make([]bool, len(members))
	for r := range free {
		free[r] = true
	}
	add := func(ranks []int, kept bool) {
		d := len(lay.Ranks)
		for s, r := range ranks {
			lay.Places[r] = Place{d, s}
			free[r] = false
		}
		lay.Ranks = append(lay.Ranks, ranks)
		lay.Kept = append(lay.Kept, kept)
		if !kept {
			lay.Formed = append(lay.Formed, d)
		}
	}

	// Rule 4: keep them, in order, at most want.
	for _, o := range olds {
		if len(lay.Ranks) < want && complete(o) && members[o.ranks[0]].Step == best {
			add(slices.Clone(o.ranks), true)
		} else {
			lay.Dropped = append(lay.Dropped, o.q)
		}
	}

	// Rule 5: the donor and the step.
	if len(lay.Ranks) > 0 {
		lay.Donor, lay.Step = 0, best
	} else {
		lay.Step = members[0].Step
		for _, m := range members {
			lay.Step = max(lay.Step, m.Step)
		}
	}

	// Rule 6: the free members, those with a place (by old replica, then
	// stage) before those without (by rank), form new replicas.
	var order []int
	for _, o := range olds {
		for _, r := range o.ranks {
			if r >= 0 && free[r] {
				order = append(order, r)
			}
		}
	}
	for r, m := range members {
		if !placed(m) {
			order = append(order, r)
		}
	}
	for len(lay.Ranks) < want && len(order) >= stages {
		group := order[:stages]
		order = order[stages:]
		ranks := make([]int, stages)
		for s := range ranks {
			ranks[s] = -1
		}
		var rest []int
		for _, r := range group {
			if m := members[r]; placed(m) && ranks[m.Stage] < 0 {
				ranks[m.Stage] = r
			} else {
				rest = append(rest, r)
			}
		}
		s := 0
		for _, r := range rest {
			for ranks[s] >= 0 {
				s++
			}
			ranks[s] = r
		}
		add(ranks, false)
	}
	// Rule 7: the rest stay Spare.
	return lay, nil
}

// check returns an error naming every corrupt statement: a place out of
// range, or two or more members claiming one place of generation g.
func check(members []Member, stages int, g uint64, placed func(Member) bool) error {
	var bad []string
	var claims []int // the ranks with a place, by (Replica, Stage, rank)
	for r, m := range members {
		switch {
		case m.Replica < -1:
			bad = append(bad, fmt.Sprintf("rank %d states replica %d", r, m.Replica))
		case m.Stage < -1 || m.Stage >= stages:
			bad = append(bad, fmt.Sprintf("rank %d states stage %d, out of range [0, %d)", r, m.Stage, stages))
		case placed(m):
			claims = append(claims, r)
		}
	}
	slices.SortStableFunc(claims, func(a, b int) int {
		if d := members[a].Replica - members[b].Replica; d != 0 {
			return d
		}
		return members[a].Stage - members[b].Stage
	})
	for i := 0; i < len(claims); {
		j := i + 1
		for j < len(claims) && members[claims[j]].Replica == members[claims[i]].Replica && members[claims[j]].Stage == members[claims[i]].Stage {
			j++
		}
		if j-i > 1 {
			ranks := make([]string, j-i)
			for k, r := range claims[i:j] {
				ranks[k] = fmt.Sprint(r)
			}
			m := members[claims[i]]
			bad = append(bad, fmt.Sprintf("ranks %s all state generation %d replica %d stage %d",
				strings.Join(ranks, ", "), g, m.Replica, m.Stage))
		}
		i = j
	}
	if len(bad) > 0 {
		return fmt.Errorf("layout: corrupt statements: %s", strings.Join(bad, "; "))
	}
	return nil
}
