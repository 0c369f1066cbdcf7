// Package hang analyses a failed collective operation from what each rank
// recorded of its last ones (collective.Group.Recent, dumped by the ranks
// that survived a timeout or an abort): it names the first rank that
// never entered the operation the others hung in, or entered another
// one, in one line. The launcher runs it on a generation's dumps; `phalanx
// debug hang --events FILE` on a saved event log.
package hang

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/phalanx-rt/phalanx/collective"
)

// Dump is one rank's hang recorder, as it dumped it when its group failed.
type Dump struct {
	Worker     int                   `json:"worker"` // its launch index (-1: unknown)
	Rank       int                   `json:"rank"`
	Generation uint64                `json:"generation"`
	Reason     string                `json:"reason"` // the group's failure
	Ops        []collective.OpRecord `json:"ops"`
}

// Finding is the analysis of one generation's dumps.
type Finding struct {
	Generation uint64 `json:"generation"`
	// Rank is the culprit (-1: none found: every rank entered the
	// operation, which failed of itself).
	Rank int `json:"rank"`
	// Line says it in one line, for example "rank 2 never entered
	// allreduce #1843 of generation 3 (last seen in backward of step 912)".
	Line string `json:"line"`
	// Op and Seq are the operation the survivors hung in.
	Op  string `json:"op"`
	Seq uint64 `json:"seq"`
}

// Analyze names the culprit of one generation's failure from its
// survivors' dumps (of that generation, of one group). The operation
// hung in is the lowest number a rank entered and did not finish, and
// what most ranks entered under that number; the culprit is the lowest rank that recorded another operation under that
// number, or never reached it: a rank with no dump never did (stopped or
// dead), one whose last operation is earlier neither.
func Analyze(dumps []Dump) (Finding, error) {
	if len(dumps) == 0 {
		return Finding{}, fmt.Errorf("hang: no dumps to analyse")
	}
	gen := dumps[0].Generation
	world := 0
	byRank := map[int]*Dump{}
	group := ""
	for i := range dumps {
		d := &dumps[i]
		if d.Generation != gen {
			return Finding{}, fmt.Errorf("hang: dumps of generations %d and %d", gen, d.Generation)
		}
		byRank[d.Rank] = d
		for _, op := range d.Ops {
			if op.Generation == gen {
				world = max(world, op.World)
				group = cmp.Or(group, op.Group)
			}
		}
	}
	// The operation the survivors hung in: the lowest number one of them
	// entered and did not finish.
	var hung *collective.OpRecord
	for _, d := range dumps {
		for i := range d.Ops {
			op := &d.Ops[i]
			if op.Generation != gen || op.Group != group || op.State == "done" || op.Op == "send/recv" {
				continue
			}
			if hung == nil || op.Seq < hung.Seq {
				hung = op
			}
			break
		}
	}
	if hung == nil {
		return Finding{Generation: gen, Rank: -1, Line: fmt.Sprintf("generation %d: every rank that dumped finished its last operation; nothing hung", gen)}, nil
	}
	// The operation that number is: what most ranks entered under it (on a
	// tie, the lowest rank's).
	votes := map[string]int{}
	first := map[string]int{}
	for _, d := range dumps {
		if op := find(d.Ops, group, hung.Seq); op != nil {
			votes[op.Op]++
			if r, ok := first[op.Op]; !ok || d.Rank < r {
				first[op.Op] = d.Rank
			}
		}
	}
	for name, n := range votes {
		if best := votes[hung.Op]; n > best || (n == best && first[name] < first[hung.Op]) {
			for _, d := range dumps {
				if op := find(d.Ops, group, hung.Seq); op != nil && op.Op == name {
					hung = op
					break
				}
			}
		}
	}
	f := Finding{Generation: gen, Rank: -1, Op: hung.Op, Seq: hung.Seq}
	what := fmt.Sprintf("%s #%d of generation %d", hung.Op, hung.Seq, gen)
	lastSeen := func(seq uint64) string {
		// Where the others saw it last: their record of the operation
		// before, which it finished with them.
		for _, d := range dumps {
			if op := find(d.Ops, group, seq); op != nil && op.State == "done" {
				return fmt.Sprintf(" (last seen in %s of step %d)", cmp.Or(op.Phase, op.Op), op.Step)
			}
		}
		return ""
	}
	for r := range max(world, 1) {
		d, ok := byRank[r]
		if !ok {
			f.Rank = r
			f.Line = fmt.Sprintf("rank %d never entered %s%s", r, what, lastSeen(hung.Seq-1))
			return f, nil
		}
		op := find(d.Ops, group, hung.Seq)
		switch {
		case op == nil:
			last := lastOf(d.Ops, group)
			seen := ""
			if last != nil {
				seen = fmt.Sprintf(" (last seen in %s of step %d, after %s #%d)", cmp.Or(last.Phase, last.Op), last.Step, last.Op, last.Seq)
			}
			f.Rank = r
			f.Line = fmt.Sprintf("rank %d never entered %s%s", r, what, seen)
			return f, nil
		case op.Op != hung.Op:
			f.Rank = r
			f.Line = fmt.Sprintf("rank %d entered %s #%d of generation %d where the others entered %s (in %s of step %d)",
				r, op.Op, op.Seq, gen, hung.Op, cmp.Or(op.Phase, "?"), op.Step)
			return f, nil
		}
	}
	reason := ""
	for _, d := range dumps {
		if d.Reason != "" {
			reason = ": " + d.Reason
			break
		}
	}
	f.Line = fmt.Sprintf("every rank entered %s; it failed of itself%s", what, reason)
	return f, nil
}

func find(ops []collective.OpRecord, group string, seq uint64) *collective.OpRecord {
	for i := range ops {
		if ops[i].Group == group && ops[i].Seq == seq && ops[i].Op != "send/recv" {
			return &ops[i]
		}
	}
	return nil
}

func lastOf(ops []collective.OpRecord, group string) *collective.OpRecord {
	for i := len(ops) - 1; i >= 0; i-- {
		if ops[i].Group == group && ops[i].Op != "send/recv" {
			return &ops[i]
		}
	}
	return nil
}

// FromEvents analyses every generation's dumps in a job's event log
// (its collective_dump events, docs/events.md), in the order of their
// generations. A line that is not an event is an error naming it.
func FromEvents(r io.Reader) ([]Finding, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	byGen := map[uint64][]Dump{}
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var head struct {
			Event string `json:"event"`
		}
		if err := json.Unmarshal([]byte(line), &head); err != nil {
			return nil, fmt.Errorf("hang: line %d is not an event: %w", n, err)
		}
		if head.Event != "collective_dump" {
			continue
		}
		var d Dump
		if err := json.Unmarshal([]byte(line), &d); err != nil {
			return nil, fmt.Errorf("hang: line %d: a malformed collective_dump: %w", n, err)
		}
		byGen[d.Generation] = append(byGen[d.Generation], d)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("hang: %w", err)
	}
	gens := make([]uint64, 0, len(byGen))
	for g := range byGen {
		gens = append(gens, g)
	}
	slices.Sort(gens)
	var out []Finding
	for _, g := range gens {
		f, err := Analyze(byGen[g])
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}
