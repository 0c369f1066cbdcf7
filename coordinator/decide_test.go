package coordinator

import (
	"slices"
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

func regs(ids ...string) []*phalanxpb.Registration {
	var out []*phalanxpb.Registration
	for _, id := range ids {
		out = append(out, &phalanxpb.Registration{Id: id, DataAddr: id + ":1", RankHint: -1})
	}
	return out
}

func gen(n uint64, ids ...string) *phalanxpb.Generation {
	g := &phalanxpb.Generation{Number: n}
	for _, id := range ids {
		g.Members = append(g.Members, &phalanxpb.Member{Id: id, DataAddr: id + ":1"})
	}
	return g
}

func ids(g *phalanxpb.Generation) []string {
	var out []string
	for _, m := range g.Members {
		out = append(out, m.Id)
	}
	return out
}

func TestDecide(t *testing.T) {
	r := Rendezvous{MinWorkers: 2, MaxWorkers: 4}
	hinted := regs("z", "y", "x")
	hinted[0].RankHint, hinted[1].RankHint = 0, 1
	cases := []struct {
		name    string
		cur     *phalanxpb.Generation
		live    []*phalanxpb.Registration
		admit   bool
		change  bool
		short   bool
		members []string
		number  uint64
		reason  string
	}{
		{"first rendezvous sorts by id", nil, regs("c", "a", "b"), true, true, false, []string{"a", "b", "c"}, 1, "rendezvous of 3"},
		{"first waits for a last call", nil, regs("c", "a", "b"), false, false, false, nil, 0, "join window"},
		{"first full needs no window", nil, regs("c", "a", "b", "d"), false, true, false, []string{"a", "b", "c", "d"}, 1, "rendezvous of 4"},
		{"rank hints first", nil, hinted, true, true, false, []string{"z", "y", "x"}, 1, "rendezvous"},
		{"too few to start", nil, regs("a"), true, false, true, nil, 0, "fewer than the minimum"},
		{"first admits at most max", nil, regs("a", "b", "c", "d", "e"), false, true, false, []string{"a", "b", "c", "d"}, 1, ""},
		{"steady", gen(3, "a", "b", "c"), regs("c", "b", "a"), true, false, false, nil, 0, ""},
		{"lost keeps ring order", gen(3, "c", "a", "b"), regs("a", "b"), false, true, false, []string{"a", "b"}, 4, "lost c"},
		{"lost middle", gen(3, "c", "a", "b"), regs("c", "b"), false, true, false, []string{"c", "b"}, 4, "lost a"},
		{"two lost at once", gen(5, "a", "b", "c", "d"), regs("a", "d"), false, true, false, []string{"a", "d"}, 6, "lost b, c"},
		{"lost below min", gen(3, "a", "b"), regs("a"), false, false, true, nil, 0, "fewer than the minimum"},
		{"newcomer waits for the window", gen(2, "a", "b"), regs("a", "b", "n"), false, false, false, nil, 0, ""},
		{"newcomer admitted", gen(2, "a", "b"), regs("a", "b", "n"), true, true, false, []string{"a", "b", "n"}, 3, "joined n"},
		{"newcomer rides a loss", gen(2, "a", "b", "c"), regs("a", "c", "n"), false, true, false, []string{"a", "c", "n"}, 3, "lost b; joined n"},
		{"full: newcomer stays out", gen(2, "a", "b", "c", "d"), regs("a", "b", "c", "d", "n"), true, false, false, nil, 0, ""},
		{"rejoin under a new id", gen(2, "a", "b", "c"), regs("a", "b", "c2"), true, true, false, []string{"a", "b", "c2"}, 3, "lost c; joined c2"},
		{"empty generation restarts rendezvous", gen(7), regs("b", "a"), true, true, false, []string{"a", "b"}, 8, "rendezvous"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.cur, tc.live, r, 17, tc.admit)
			if d.Change != tc.change || d.Short != tc.short {
				t.Fatalf("change %v short %v (%q), want change %v short %v", d.Change, d.Short, d.Reason, tc.change, tc.short)
			}
			if !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("reason %q, want it to contain %q", d.Reason, tc.reason)
			}
			if !tc.change {
				return
			}
			if got := ids(d.Next); !slices.Equal(got, tc.members) {
				t.Errorf("members %v, want %v", got, tc.members)
			}
			if d.Next.Number != tc.number || d.Next.StartStep != 17 {
				t.Errorf("generation %d from step %d, want %d from 17", d.Next.Number, d.Next.StartStep, tc.number)
			}
		})
	}
}

// TestDecideDeterministic: the order of the registrations does not matter.
func TestDecideDeterministic(t *testing.T) {
	r := Rendezvous{MinWorkers: 1, MaxWorkers: 8}
	a := Decide(gen(4, "q", "p"), regs("p", "x", "q", "m"), r, 0, true)
	b := Decide(gen(4, "q", "p"), regs("m", "q", "x", "p"), r, 0, true)
	if !slices.Equal(ids(a.Next), ids(b.Next)) || !slices.Equal(ids(a.Next), []string{"q", "p", "m", "x"}) {
		t.Errorf("%v and %v", ids(a.Next), ids(b.Next))
	}
	if (Rendezvous{MinWorkers: 3, MaxWorkers: 2}).Validate() == nil || (Rendezvous{}).Validate() == nil {
		t.Error("invalid rendezvous accepted")
	}
}
