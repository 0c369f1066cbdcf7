package job

import (
	"fmt"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// EtcdRetryBudget bounds how long a launcher or parameter-server worker
// retries a request through transient etcd errors (an election in the etcd
// cluster) before giving up.
const EtcdRetryBudget = 30 * time.Second

// ExitStopped is a worker's exit status when the job stopped (below its
// minimum of workers, or on request after a final checkpoint): not a
// failure of its own.
const ExitStopped = 4

// CheckpointText is a checkpoint event in plain lines, for a terminal (""
// for a kind it does not know).
func CheckpointText(e *checkpoint.Event) string {
	switch e.Kind {
	case "saved":
		return fmt.Sprintf("checkpoint of step %d saved: %s (%s in %.2fs)\n", e.Step, e.URL, bytesize.Format(e.Bytes), e.Seconds)
	case "failed":
		return fmt.Sprintf("checkpoint of step %d FAILED: %s\n", e.Step, e.Err)
	case "skipped":
		return fmt.Sprintf("checkpoint %s skipped: %s\n", e.ID, e.Err)
	case "restored":
		s := fmt.Sprintf("resumed from %s: step %d, written by %d workers, now %d\n", e.URL, e.Step, e.WorldBefore, e.WorldAfter)
		if e.ConfigChanged {
			s += "warning: that checkpoint was written with other training settings (batch, optimizer, clipping or synchronisation)\n"
		}
		return s
	}
	return ""
}

// GenerationEvents are the events of a generation read from etcd, for
// every kind whose workers the coordinator places (first: the job's first
// generation's number, whose members did not join): the generation (its
// members by rank, with id and pid), who was lost or left, who was
// excluded as a straggler or readmitted, who joined.
func GenerationEvents(ev events.Sink, g *phalanxpb.Generation, first uint64) {
	if g.Stopped {
		ev.Emit("generation", events.F("generation", g.Number), events.F("members", []any{}), events.F("world", 0), events.F("reason", g.Reason))
		return
	}
	members := make([]map[string]any, len(g.Members))
	pos := map[string]int{}
	for i, m := range g.Members {
		members[i] = map[string]any{"rank": i, "id": m.Id, "pid": m.Pid}
		pos[m.Id] = i
	}
	ev.Emit("generation", events.F("generation", g.Number), events.F("members", members), events.F("world", len(g.Members)),
		events.F("reason", g.Reason), events.F("decided_by", g.DecidedBy))
	for _, l := range g.Lost {
		kind := "worker_lost"
		if l.Left {
			kind = "worker_left"
		}
		ev.Emit(kind, events.F("generation", g.Number), events.F("rank", l.Rank), events.F("pid", l.Pid), events.F("id", l.Id), events.F("detected_by", l.DetectedBy))
	}
	for _, x := range g.Excluded {
		ev.Emit("straggler_excluded", events.F("generation", g.Number), events.F("rank", x.Rank), events.F("pid", x.Pid), events.F("id", x.Id),
			events.F("late_in", x.LateIn), events.F("window", x.Window), events.F("step", x.Step))
	}
	for _, id := range g.Readmitted {
		i := pos[id]
		ev.Emit("straggler_readmitted", events.F("generation", g.Number), events.F("rank", i), events.F("pid", g.Members[i].Pid), events.F("id", id))
	}
	for _, id := range g.Joined {
		if g.Number == first {
			break
		}
		i := pos[id]
		ev.Emit("worker_joined", events.F("generation", g.Number), events.F("rank", i), events.F("pid", g.Members[i].Pid), events.F("id", id))
	}
}
