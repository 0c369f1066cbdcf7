package coordinator

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Rendezvous bounds a generation's size.
type Rendezvous struct {
	MinWorkers int
	MaxWorkers int
}

// Validate reports bounds that admit no generation.
func (r Rendezvous) Validate() error {
	if r.MinWorkers < 1 || r.MaxWorkers < r.MinWorkers {
		return fmt.Errorf("coordinator: rendezvous of %d..%d workers: want 1 <= min <= max", r.MinWorkers, r.MaxWorkers)
	}
	return nil
}

// Decision is what Decide concludes.
type Decision struct {
	Change bool                  // write Next
	Next   *phalanxpb.Generation // the new generation when Change
	Reason string
	// Short is set when the live workers are fewer than MinWorkers: no
	// generation can be formed (the caller times this out).
	Short bool
}

// Input is what a decision is made from.
type Input struct {
	Current    *phalanxpb.Generation // nil before the first
	Live       []*phalanxpb.Registration
	Rendezvous Rendezvous
	Step       int64 // the step the next generation starts at
	// Admit: the join window of some newcomer has passed.
	Admit bool
	// Broken: a member of the current ring reported a failure that removed
	// nobody (the reported peer answered): the ring is rebuilt as it is.
	Broken bool
	// DetectedBy says how a lost member was detected, by id; a lost member
	// missing from it is one whose lease expired.
	DetectedBy map[string]string
	// Left gives the reason of the members that left on request, by id.
	Left map[string]string
	// Excluded are stragglers to keep out of the ring (by id): members are
	// left out, unless that would leave fewer than MinWorkers (then none
	// is), and excluded newcomers wait. WasExcluded names the ids whose
	// admission is a readmission.
	Excluded    map[string]*phalanxpb.Exclusion
	WasExcluded map[string]bool
}

// Decide computes the next generation from the current one and the live
// registrations. Survivors keep their relative ring order; newcomers go after
// them, by rank hint then id. Newcomers are admitted only when Admit is set
// or a member was lost (the ring is rebuilt anyway), and never beyond
// MaxWorkers. The first generation forms once MinWorkers are live and either
// MaxWorkers are or the join window has passed. It has no I/O, clock or
// randomness: the same inputs give the same generation.
func Decide(in Input) Decision {
	cur, r := in.Current, in.Rendezvous
	byID := make(map[string]*phalanxpb.Registration, len(in.Live))
	for _, reg := range in.Live {
		byID[reg.Id] = reg
	}
	var survivors []*phalanxpb.Member
	var lost, excluded []*phalanxpb.LostMember
	inCur := map[string]bool{}
	if cur != nil {
		live := 0
		for _, m := range cur.Members {
			if byID[m.Id] != nil && in.Excluded[m.Id] == nil {
				live++
			}
		}
		exclude := live >= max(r.MinWorkers, 1) // never exclude below the minimum
		for i, m := range cur.Members {
			inCur[m.Id] = true
			if reg, ok := byID[m.Id]; ok {
				if x := in.Excluded[m.Id]; x != nil && exclude {
					excluded = append(excluded, &phalanxpb.LostMember{Id: m.Id, Rank: int32(i), Pid: m.Pid, LateIn: x.LateIn, Window: x.Window, Step: x.Step,
						DetectedBy: fmt.Sprintf("straggler: late in %d of its last %d steps", x.LateIn, x.Window)})
					continue
				}
				survivors = append(survivors, memberOf(reg))
				continue
			}
			by := in.DetectedBy[m.Id]
			why, left := in.Left[m.Id]
			switch {
			case left:
				by = "left on request: " + why
			case by == "":
				by = "lease expired"
			}
			lost = append(lost, &phalanxpb.LostMember{Id: m.Id, Rank: int32(i), Pid: m.Pid, DetectedBy: by, Left: left})
		}
	}
	var newcomers []*phalanxpb.Registration
	for _, reg := range in.Live {
		if !inCur[reg.Id] && in.Excluded[reg.Id] == nil {
			newcomers = append(newcomers, reg)
		}
	}
	slices.SortFunc(newcomers, func(a, b *phalanxpb.Registration) int {
		ha, hb := hint(a), hint(b)
		if ha != hb {
			if ha < hb {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Id, b.Id)
	})
	first := cur == nil || len(cur.Members) == 0
	broken := in.Broken && !first
	if !first && len(lost) == 0 && len(excluded) == 0 && !broken && (!in.Admit || len(newcomers) == 0 || len(survivors) >= r.MaxWorkers) {
		return Decision{} // nothing to do
	}
	members := survivors
	var joined []string
	if first || in.Admit || len(lost) > 0 || len(excluded) > 0 || broken {
		for _, reg := range newcomers {
			if len(members) >= r.MaxWorkers {
				break
			}
			members = append(members, memberOf(reg))
			joined = append(joined, reg.Id)
		}
	}
	if len(members) < r.MinWorkers {
		return Decision{Short: true, Reason: fmt.Sprintf("%d live workers, fewer than the minimum of %d", len(members), r.MinWorkers)}
	}
	if first && !in.Admit && len(members) < r.MaxWorkers {
		return Decision{Reason: "rendezvous: waiting for the join window"} // a last call for more workers
	}
	var why []string
	switch {
	case first:
		why = append(why, fmt.Sprintf("rendezvous of %d workers", len(members)))
	default:
		for _, l := range lost {
			verb := "lost"
			if l.Left {
				verb = "left"
			}
			why = append(why, fmt.Sprintf("%s rank %d (%s, %s)", verb, l.Rank, l.Id, l.DetectedBy))
		}
		for _, x := range excluded {
			why = append(why, fmt.Sprintf("excluded rank %d (%s, %s)", x.Rank, x.Id, x.DetectedBy))
		}
		readmitted := readmittedOf(joined, in.WasExcluded)
		if len(readmitted) > 0 {
			why = append(why, "readmitted "+strings.Join(readmitted, ", "))
		}
		if len(joined) > len(readmitted) {
			why = append(why, "joined "+strings.Join(slices.DeleteFunc(slices.Clone(joined), func(id string) bool { return in.WasExcluded[id] }), ", "))
		}
		if len(lost) == 0 && len(joined) == 0 && len(excluded) == 0 {
			why = append(why, "ring rebuilt after a failure that removed nobody")
		}
	}
	var number uint64 = 1
	if cur != nil {
		number = cur.Number + 1
	}
	reason := strings.Join(why, "; ")
	return Decision{Change: true, Reason: reason,
		Next: &phalanxpb.Generation{Number: number, Members: members, StartStep: in.Step, Reason: reason, Lost: lost, Joined: joined,
			Excluded: excluded, Readmitted: readmittedOf(joined, in.WasExcluded)}}
}

func readmittedOf(joined []string, was map[string]bool) []string {
	var out []string
	for _, id := range joined {
		if was[id] {
			out = append(out, id)
		}
	}
	return out
}

func hint(r *phalanxpb.Registration) int32 {
	if r.RankHint < 0 {
		return 1 << 30
	}
	return r.RankHint
}

func memberOf(r *phalanxpb.Registration) *phalanxpb.Member {
	return &phalanxpb.Member{Id: r.Id, DataAddr: r.DataAddr, ControlAddr: r.ControlAddr, Pid: r.Pid, HostIdentity: r.HostIdentity}
}

// rules are what a coordinator's rounds decide by: Config's fields of the
// same names, defaults applied.
type rules struct {
	rendezvous        Rendezvous
	joinWindow        time.Duration
	minWorkersTimeout time.Duration
	firstRing         int
	firstRingWait     time.Duration
}

// clocks are the times a coordinator's decisions wait on, carried from one
// round to the next.
type clocks struct {
	// firstSeen: when each waiting newcomer was first seen live, by id.
	firstSeen map[string]time.Time
	// shortSince: since when the ring has been below MinWorkers; zero when
	// it is not.
	shortSince time.Time
}

// round is what one decision of a coordinator is made from: the job as
// read, what the coordinator remembers and the time.
type round struct {
	now time.Time
	// current is the generation record as read, stopped or not; nil before
	// the first.
	current     *phalanxpb.Generation
	live        []*phalanxpb.Registration
	excluded    map[string]*phalanxpb.Exclusion
	left        map[string]string
	broken      bool
	detectedBy  map[string]string
	wasExcluded map[string]bool
	clocks      clocks
}

// verdict is what a round concludes.
type verdict struct {
	// next is the generation to write; nil: none.
	next *phalanxpb.Generation
	// stop: next is the empty generation that stops a job that stayed
	// below MinWorkers for MinWorkersTimeout.
	stop   bool
	reason string
	// wake is when to decide again if nothing changes (a join window or a
	// wait ends); zero: only on a change. Zero when next is set: the
	// caller reads again at once.
	wake time.Time
	// clocks are the round's, to carry into the next one.
	clocks clocks
}

// decideRound is Decide with its clocks: it admits newcomers once the join
// window of one of them has passed, holds the first generation for the
// workers the launcher started (FirstRing, up to FirstRingWait from the
// earliest registration), and stops a job whose ring stayed below
// MinWorkers for MinWorkersTimeout. Like Decide it has no I/O and reads no
// clock: the time is in, the next wake-up out.
func decideRound(ru rules, in round) verdict {
	now := in.now
	members := map[string]bool{}
	if in.current != nil {
		for _, m := range in.current.Members {
			members[m.Id] = true
		}
	}
	var wake time.Duration = -1
	soonest := func(left time.Duration) {
		if wake < 0 || left < wake {
			wake = left
		}
	}
	admit := false
	firstSeen := map[string]time.Time{} // the waiting newcomers only: one gone and back waits anew
	for _, r := range in.live {
		if members[r.Id] || in.excluded[r.Id] != nil {
			continue // an excluded straggler waits, without a join window, until readmitted
		}
		seen, ok := in.clocks.firstSeen[r.Id]
		if !ok {
			seen = now
		}
		firstSeen[r.Id] = seen
		if left := ru.joinWindow - now.Sub(seen); left <= 0 {
			admit = true
		} else {
			soonest(left)
		}
	}
	if in.current == nil && admit {
		if hold, left := firstRingHolds(ru.firstRing, ru.firstRingWait, len(firstSeen), firstSeen, now); hold {
			admit = false
			soonest(left)
		}
	}
	var start int64
	if in.current != nil {
		start = in.current.StartStep
	}
	cur := in.current
	if cur != nil && cur.Stopped {
		cur = nil // a stopped job starts over with a rendezvous
	}
	d := Decide(Input{Current: cur, Live: in.live, Rendezvous: ru.rendezvous, Step: start, Admit: admit,
		Broken: in.broken, DetectedBy: in.detectedBy, Left: in.left, Excluded: in.excluded, WasExcluded: in.wasExcluded})
	out := verdict{reason: d.Reason, clocks: clocks{firstSeen: firstSeen}}
	switch {
	case d.Change:
		if in.current != nil {
			d.Next.Number = in.current.Number + 1
		}
		out.next = d.Next
		return out
	case d.Short && cur != nil && len(cur.Members) > 0:
		since := in.clocks.shortSince
		if since.IsZero() {
			since = now
		}
		left := ru.minWorkersTimeout - now.Sub(since)
		if left <= 0 {
			out.next = &phalanxpb.Generation{Number: in.current.Number + 1, StartStep: start, Stopped: true,
				Reason: fmt.Sprintf("stopped: %s for longer than %s", d.Reason, ru.minWorkersTimeout)}
			out.stop, out.reason = true, out.next.Reason
			return out
		}
		out.clocks.shortSince = since
		soonest(left)
	}
	if wake >= 0 {
		out.wake = now.Add(wake)
	}
	return out
}

// firstRingHolds says whether the first generation still waits for the
// workers the launcher started: fewer than want are live and wait has not
// passed since the earliest registration; left is how long it may still
// wait.
func firstRingHolds(want int, wait time.Duration, live int, firstSeen map[string]time.Time, now time.Time) (bool, time.Duration) {
	if want <= 0 || live >= want || len(firstSeen) == 0 {
		return false, 0
	}
	var earliest time.Time
	for _, t := range firstSeen {
		if earliest.IsZero() || t.Before(earliest) {
			earliest = t
		}
	}
	left := wait - now.Sub(earliest)
	return left > 0, left
}
