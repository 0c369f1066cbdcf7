package hang

import (
	"strings"
	"testing"

	"github.com/phalanx-rt/phalanx/collective"
)

// ops are a rank's last operations: numbers from..to done, the last one's
// state given, each in backward of step seq/2.
func ops(rank, world int, from, to uint64, last string, lastOp string) []collective.OpRecord {
	var out []collective.OpRecord
	for s := from; s <= to; s++ {
		op := collective.OpRecord{Op: "allreduce", Group: "j", Seq: s, Generation: 3, Rank: rank, World: world, State: "done",
			Phase: "forward/backward", Step: int64(s / 2)}
		if s == to {
			op.State = last
			if lastOp != "" {
				op.Op = lastOp
			}
		}
		out = append(out, op)
	}
	return out
}

// TestAnalyze: the line names the rank that never entered the operation
// the others hung in, or entered another, or none when all did.
func TestAnalyze(t *testing.T) {
	for _, c := range []struct {
		name  string
		dumps []Dump
		rank  int
		line  string
	}{
		{"a stopped rank dumps nothing", []Dump{
			{Rank: 0, Generation: 3, Ops: ops(0, 3, 1830, 1843, "failed", "")},
			{Rank: 1, Generation: 3, Ops: ops(1, 3, 1830, 1843, "failed", "")},
		}, 2, "rank 2 never entered allreduce #1843 of generation 3 (last seen in forward/backward of step 921)"},
		{"a rank behind", []Dump{
			{Rank: 0, Generation: 3, Ops: ops(0, 3, 1830, 1843, "failed", "")},
			{Rank: 1, Generation: 3, Ops: ops(1, 3, 1830, 1841, "done", "")},
			{Rank: 2, Generation: 3, Ops: ops(2, 3, 1830, 1843, "failed", "")},
		}, 1, "rank 1 never entered allreduce #1843 of generation 3 (last seen in forward/backward of step 920, after allreduce #1841)"},
		{"a rank in another operation", []Dump{
			{Rank: 0, Generation: 3, Ops: ops(0, 3, 1830, 1843, "failed", "")},
			{Rank: 1, Generation: 3, Ops: ops(1, 3, 1830, 1843, "failed", "barrier")},
			{Rank: 2, Generation: 3, Ops: ops(2, 3, 1830, 1843, "failed", "")},
		}, 1, "rank 1 entered barrier #1843 of generation 3 where the others entered allreduce (in forward/backward of step 921)"},
		{"the others' operation is the majority's, whoever dumped first", []Dump{
			{Rank: 1, Generation: 3, Ops: ops(1, 3, 1830, 1843, "failed", "barrier")},
			{Rank: 0, Generation: 3, Ops: ops(0, 3, 1830, 1843, "failed", "")},
			{Rank: 2, Generation: 3, Ops: ops(2, 3, 1830, 1843, "failed", "")},
		}, 1, "rank 1 entered barrier #1843 of generation 3 where the others entered allreduce"},
		{"every rank in it", []Dump{
			{Rank: 0, Generation: 3, Reason: "peer 1 timed out", Ops: ops(0, 2, 1830, 1843, "failed", "")},
			{Rank: 1, Generation: 3, Ops: ops(1, 2, 1830, 1843, "failed", "")},
		}, -1, "every rank entered allreduce #1843 of generation 3; it failed of itself: peer 1 timed out"},
		{"the survivors hung in different places: the lowest", []Dump{
			{Rank: 0, Generation: 3, Ops: ops(0, 3, 1830, 1844, "failed", "")},
			{Rank: 2, Generation: 3, Ops: ops(2, 3, 1830, 1843, "entered", "")},
		}, 1, "rank 1 never entered allreduce #1843 of generation 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := Analyze(c.dumps)
			if err != nil {
				t.Fatal(err)
			}
			if f.Rank != c.rank || !strings.HasPrefix(f.Line, c.line) {
				t.Errorf("rank %d, %q; want rank %d, %q", f.Rank, f.Line, c.rank, c.line)
			}
		})
	}
}

// TestFromEvents: an event log's dumps are analysed a generation at a
// time; a line that is not JSON is refused, naming it.
func TestFromEvents(t *testing.T) {
	log := `{"ts":1,"event":"step","step":3}
{"ts":2,"event":"collective_dump","worker":0,"rank":0,"generation":3,"ops":[{"op":"allreduce","group":"j","seq":7,"generation":3,"rank":0,"world":2,"state":"done","phase":"forward/backward","step":3},{"op":"allreduce","group":"j","seq":8,"generation":3,"rank":0,"world":2,"state":"failed","step":4}]}
{"ts":3,"event":"generation","generation":4}
`
	fs, err := FromEvents(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 || fs[0].Rank != 1 || fs[0].Line != "rank 1 never entered allreduce #8 of generation 3 (last seen in forward/backward of step 3)" {
		t.Errorf("findings %+v", fs)
	}
	if _, err := FromEvents(strings.NewReader(log + "garbage\n")); err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("a garbage line: %v, want an error naming line 4", err)
	}
}
