package metrics

import (
	"strconv"

	"github.com/phalanx-rt/phalanx/events"
)

// Emit records what a job's event says in the launcher's metrics: the
// generation and world size, workers lost, left, excluded and readmitted,
// rank restarts, checkpoints saved and failed, parameter-server failovers
// and pipeline bubbles. A *Set is so an events.Sink; events of other
// kinds, and a set of another process than a launcher, record nothing.
func (s *Set) Emit(event string, fields ...events.Field) error {
	if s == nil || s.lost == nil {
		return nil
	}
	f := func(key string) float64 {
		for _, x := range fields {
			if x.Key == key {
				n, _ := events.Number(x.Value)
				return n
			}
		}
		return 0
	}
	switch event {
	case "generation":
		s.generation.Set(f("generation"))
		s.world.Set(f("world"))
	case "worker_lost":
		s.lost.Inc()
	case "worker_left":
		s.left.Inc()
	case "straggler_excluded":
		s.excluded.Inc()
	case "straggler_readmitted":
		s.readmitted.Inc()
	case "rank_restarted":
		s.restarts.WithLabelValues(strconv.Itoa(int(f("rank")))).Inc()
	case "checkpoint_saved":
		s.ckSaved.Inc()
		s.ckBytes.Add(f("bytes"))
		s.ckSeconds.Observe(f("seconds"))
	case "checkpoint_failed":
		s.ckFailures.Inc()
	case "ps_failover":
		s.psFailovers.Inc()
	case "pipeline_step":
		s.bubble.WithLabelValues(strconv.Itoa(int(f("stage")))).Set(f("bubble"))
	}
	return nil
}
