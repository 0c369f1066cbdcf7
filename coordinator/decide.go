package coordinator

import (
	"fmt"
	"slices"
	"strings"

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
