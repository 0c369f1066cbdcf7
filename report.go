package phalanx

import (
	"encoding/json"
	"io"
	"sync"

	"github.com/phalanx-rt/phalanx/checkpoint"
)

// Report is what a worker tells of itself: rank 0 of each generation
// reports the job's progress, every worker its own restarts, checkpoints
// and departures. A launched worker prints each as one JSON line on stdout
// for its launcher, which turns them into the job's events
// (docs/events.md); RunWorker hands them to Config.Reports.
type Report struct {
	// Kind is registered, restored, step, restart, checkpoint, fed,
	// overlap_fallback, stopped, left or done (ring workers), ps_step, ps_checkpoint or
	// ps_done (parameter-server workers), or failed (any worker's last
	// word: Reason).
	Kind         string            `json:"kind"`
	ID           string            `json:"id,omitempty"`
	Pid          int               `json:"pid,omitempty"`
	Worker       int               `json:"worker,omitempty"` // a parameter-server worker's index
	Step         int64             `json:"step"`
	Steps        int64             `json:"steps,omitempty"` // the job's
	Generation   uint64            `json:"generation"`
	World        int               `json:"world"`
	Rank         int               `json:"rank"`
	Loss         float64           `json:"loss"`
	Accuracy     float64           `json:"accuracy"`
	SamplesPS    float64           `json:"samples_per_s"`
	ComputeS     float64           `json:"compute_s"`
	CommS        float64           `json:"comm_s"`
	StepS        float64           `json:"step_s"`
	Epoch        int64             `json:"epoch"`
	Offset       int64             `json:"offset"`
	Fingerprint  [5]float64        `json:"fingerprint"`
	Redone       int64             `json:"steps_redone"`
	Root         int               `json:"root"`
	Late         []int             `json:"late,omitempty"`       // overlap_fallback: the ranks not ready by the deadline
	DeadlineS    float64           `json:"deadline_s,omitempty"` // overlap_fallback: the step's deadline
	DataPlane    string            `json:"data_plane,omitempty"` // restored: how rank 0 reaches its peers (collective.Group.DataPlane)
	Reason       string            `json:"reason,omitempty"`
	Restarts     int               `json:"restarts,omitempty"`
	Replayed     bool              `json:"replayed,omitempty"`      // a step report repeated after a ring change
	TrainedIn    uint64            `json:"trained_in,omitempty"`    // a replayed step: the generation that trained it (Generation is the reporting ring's)
	Identical    *bool             `json:"identical,omitempty"`     // done: every rank ends with bitwise the same parameters
	ParamsCRC    uint32            `json:"params_crc32c,omitempty"` // done: rank 0's parameters' CRC32C
	RankCRCs     []uint32          `json:"rank_crc32c,omitempty"`   // done: every rank's, by rank
	Participants int               `json:"participants,omitempty"`  // ranks whose gradients entered the step's update
	Stale        int               `json:"stale,omitempty"`         // ranks (or pushes) that missed the step
	Checkpoint   *checkpoint.Event `json:"checkpoint,omitempty"`
	// Metrics are a parameter-server model's held-out measures (ps_done),
	// and Shards the shards' accounts.
	Metrics map[string]float64 `json:"metrics,omitempty"`
	Shards  []ShardAccount     `json:"shards,omitempty"`
	// PSShare is a parameter-server worker's claim or completion of a data
	// share (ps_share, ps_share_done).
	PSShare *PSShareReport `json:"ps_share,omitempty"`
}

// ShardAccount is a parameter-server shard's state at the end of a job: its
// clock, its rows, and the pushes applied from each worker (each once).
type ShardAccount struct {
	Shard  int      `json:"shard"`
	Clock  int64    `json:"clock"`
	Rows   uint64   `json:"rows"`
	Pushes []uint64 `json:"pushes"`
}

// reporter hands reports to Config.Reports, one at a time.
type reporter struct {
	mu sync.Mutex
	f  func(Report)
}

func (r *reporter) send(rep Report) {
	if r.f == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.f(rep)
}

// ReportLines writes reports as JSON lines to w: how a launched worker
// tells its launcher (for Config.Reports).
func ReportLines(w io.Writer) func(Report) {
	enc := json.NewEncoder(w)
	return func(r Report) { enc.Encode(r) }
}
