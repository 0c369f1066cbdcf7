package job

import (
	"fmt"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
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
