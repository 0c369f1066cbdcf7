package job

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/worker"
)

// Report is what a worker tells of itself: rank 0 of each generation
// reports the job's progress, every worker its own restarts, checkpoints
// and departures. A launched worker prints each as one JSON line on stdout
// for its launcher, which turns them into the job's events
// (docs/events.md); RunWorker hands them to Config.Reports.
type Report struct {
	// Kind is registered, restored, training (every rank, as it starts
	// training in a ring), step, restart, checkpoint, fed,
	// overlap_fallback, stopped, left or done (ring workers), ps_step, ps_checkpoint or
	// ps_done (parameter-server workers), or failed (any worker's last
	// word: Reason).
	Kind        string     `json:"kind"`
	ID          string     `json:"id,omitempty"`
	Pid         int        `json:"pid,omitempty"`
	Worker      int        `json:"worker,omitempty"` // a parameter-server worker's index
	Step        int64      `json:"step"`
	Steps       int64      `json:"steps,omitempty"` // the job's
	Generation  uint64     `json:"generation"`
	World       int        `json:"world"`
	Rank        int        `json:"rank"`
	Loss        float64    `json:"loss"`
	Accuracy    float64    `json:"accuracy"`
	SamplesPS   float64    `json:"samples_per_s"`
	ComputeS    float64    `json:"compute_s"`
	CommS       float64    `json:"comm_s"`
	StepS       float64    `json:"step_s"`
	Epoch       int64      `json:"epoch"`
	Offset      int64      `json:"offset"`
	Fingerprint [5]float64 `json:"fingerprint"`
	Redone      int64      `json:"steps_redone"`
	Root        int        `json:"root"`
	Late        []int      `json:"late,omitempty"`       // overlap_fallback: the ranks not ready by the deadline
	DeadlineS   float64    `json:"deadline_s,omitempty"` // overlap_fallback: the step's deadline
	DataPlane   string     `json:"data_plane,omitempty"` // restored: how rank 0 reaches its peers (collective.Group.DataPlane)
	Reason      string     `json:"reason,omitempty"`
	// NonFinite is a failure's step whose reduced gradients or loss were
	// not finite (failed): every rank of the ring fails it.
	NonFinite    *worker.NonFiniteError `json:"non_finite,omitempty"`
	Restarts     int                    `json:"restarts,omitempty"`
	Replayed     bool                   `json:"replayed,omitempty"`      // a step report repeated after a ring change
	TrainedIn    uint64                 `json:"trained_in,omitempty"`    // a replayed step: the generation that trained it (Generation is the reporting ring's)
	Identical    *bool                  `json:"identical,omitempty"`     // done: every rank ends with bitwise the same parameters
	ParamsCRC    uint32                 `json:"params_crc32c,omitempty"` // done: rank 0's parameters' CRC32C
	RankCRCs     []uint32               `json:"rank_crc32c,omitempty"`   // done: every rank's, by rank
	Participants int                    `json:"participants,omitempty"`  // ranks whose gradients entered the step's update
	Stale        int                    `json:"stale,omitempty"`         // ranks (or pushes) that missed the step
	Checkpoint   *checkpoint.Event      `json:"checkpoint,omitempty"`
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

// Reporter hands reports to Config.Reports, one at a time.
type Reporter struct {
	mu sync.Mutex
	f  func(Report)
}

// NewReporter hands reports to f (nil: none).
func NewReporter(f func(Report)) *Reporter { return &Reporter{f: f} }

// Send hands rep over.
func (r *Reporter) Send(rep Report) {
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

// ReportText writes reports as plain lines to w, for a person watching one
// worker (phalanx worker without --json): what it registered as, its
// generations, a progress line every every steps of the job's steps (rank
// 0 alone reports steps; samples/s is what was trained since the previous
// line), its restarts, checkpoints and end.
func ReportText(w io.Writer, steps, every int64) func(Report) {
	every = max(every, 1)
	var samples, secs float64
	return func(r Report) {
		switch r.Kind {
		case "registered":
			fmt.Fprintf(w, "registered as %s (pid %d); waiting for a ring\n", r.ID, r.Pid)
		case "restored":
			fmt.Fprintf(w, "generation %d: rank 0 of %d workers, at step %d (%d redone), over %s\n", r.Generation, r.World, r.Step, r.Redone, r.DataPlane)
		case "step", "ps_step":
			if r.Replayed {
				return
			}
			samples += r.SamplesPS * r.StepS
			secs += r.StepS
			if r.Step%every != 0 && r.Step != steps {
				return
			}
			line := fmt.Sprintf("step %d/%d  loss %.4f", r.Step, cmp.Or(r.Steps, steps), r.Loss)
			if r.Kind == "step" {
				line += fmt.Sprintf("  acc %5.1f%%  %d workers", 100*r.Accuracy, r.World)
			}
			if secs > 0 {
				line += fmt.Sprintf("  %.0f samples/s", samples/secs)
			}
			samples, secs = 0, 0
			fmt.Fprintln(w, line)
		case "restart":
			fmt.Fprintf(w, "rank %d restarted by its supervisor (%s); resumed from the commit of step %d\n", r.Rank, r.Reason, r.Step)
		case "checkpoint":
			if r.Checkpoint != nil {
				fmt.Fprint(w, CheckpointText(r.Checkpoint))
			}
		case "stopped":
			fmt.Fprintf(w, "the job stopped at step %d\n", r.Step)
		case "left":
			fmt.Fprintln(w, "left the job; the others go on")
		case "done":
			fmt.Fprintf(w, "done: step %d on %d workers; held-out loss %.4f, accuracy %.2f%%\n", r.Step, r.World, r.Loss, 100*r.Accuracy)
		case "ps_done":
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(r.Metrics)) {
				parts = append(parts, fmt.Sprintf("%s %.4f", k, r.Metrics[k]))
			}
			fmt.Fprintf(w, "done: step %d; %s\n", r.Step, strings.Join(parts, ", "))
		case "failed":
			fmt.Fprintf(w, "failed: %s\n", r.Reason)
		}
	}
}

// PSShareReport is a worker's report of a share it claimed (ps_share) or
// finished (ps_share_done).
type PSShareReport struct {
	Share int `json:"share"`
	// Reason is own (the worker's own share) or adopted (a share whose
	// worker died).
	Reason string `json:"reason"`
	// From is the step the share resumes after; ReplayedTo the last step
	// some shard already applied (steps From+1..ReplayedTo are pushed
	// again, as duplicates where applied).
	From       int64 `json:"from"`
	ReplayedTo int64 `json:"replayed_to"`
	// Steps (done) is the share's last step; Duplicates how many pushes
	// the shards answered as applied already.
	Steps      int64 `json:"steps,omitempty"`
	Duplicates int64 `json:"duplicates,omitempty"`
}

// ParseReport reads a launched process's report line; anything else it
// printed on stdout is an error naming the process.
func ParseReport(l launch.Line) (Report, error) {
	var rep Report
	if err := json.Unmarshal(l.Text, &rep); err != nil {
		return rep, fmt.Errorf("phalanx: %s %d printed %q, not a report: %w", l.Role, l.Index, l.Text, err)
	}
	return rep, nil
}
