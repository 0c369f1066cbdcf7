package ring

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/job"
)

// The ring workers' own reports, beside the common ones of package job
// (Registered, Training, Checkpoint, Stopped, Left, Failed).

// Step: rank 0 of a ring trained a step (or, Replayed, reports again a
// step its ring trained before a ring change).
type Step struct {
	Step       int64   `json:"step"`
	Generation uint64  `json:"generation"` // the reporting ring's
	World      int     `json:"world"`
	Loss       float64 `json:"loss"`
	Accuracy   float64 `json:"accuracy"`
	SamplesPS  float64 `json:"samples_per_s"`
	ComputeS   float64 `json:"compute_s"`
	CommS      float64 `json:"comm_s"`
	StepS      float64 `json:"step_s"`
	Epoch      int64   `json:"epoch"`
	Offset     int64   `json:"offset"`
	// Fingerprint: the count and byte sums of the global batch's sample
	// indices, summed over the ranks.
	Fingerprint  [5]float64 `json:"fingerprint"`
	Participants int        `json:"participants,omitempty"` // ranks whose gradients entered the step's update
	Stale        int        `json:"stale,omitempty"`        // ranks that missed the step
	Replayed     bool       `json:"replayed,omitempty"`
	TrainedIn    uint64     `json:"trained_in,omitempty"` // a replayed step: the generation that trained it
}

// Restored: rank 0 of a new ring resumed at Step, Redone steps redone,
// the state sent from rank Root, its peers reached over DataPlane
// (collective.Group.DataPlane).
type Restored struct {
	Generation uint64 `json:"generation"`
	World      int    `json:"world"`
	Step       int64  `json:"step"`
	Redone     int64  `json:"steps_redone"`
	Root       int    `json:"root"`
	DataPlane  string `json:"data_plane"`
}

// Restart: a rank's actor was restarted by its supervisor and resumed from
// the commit of Step.
type Restart struct {
	Rank     int    `json:"rank"`
	Step     int64  `json:"step"`
	Reason   string `json:"reason"`
	Restarts int    `json:"restarts"`
}

// OverlapFallback: a hybrid step's ranks Late were not ready by its
// deadline, so the step fell back from overlapped reduction.
type OverlapFallback struct {
	Step      int64   `json:"step"`
	Late      []int   `json:"late"`
	DeadlineS float64 `json:"deadline_s"`
}

// Fed: a readmitted straggler ID was fed the parameters of Step.
type Fed struct {
	ID   string `json:"id"`
	Step int64  `json:"step"`
}

// Done: rank 0's last word: the held-out measures, and whether every rank
// ends with bitwise the same parameters (their CRC32C by rank).
type Done struct {
	Step       int64    `json:"step"`
	Generation uint64   `json:"generation"`
	World      int      `json:"world"`
	Loss       float64  `json:"loss"`
	Accuracy   float64  `json:"accuracy"`
	Identical  bool     `json:"identical"`
	ParamsCRC  uint32   `json:"params_crc32c"`
	RankCRCs   []uint32 `json:"rank_crc32c,omitempty"`
	// Metrics are the model's further held-out measures (Task.Measures).
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// reportTypes are the reports a ring's workers print.
func reportTypes() job.ReportTypes {
	return job.NewReportTypes(Step{}, Restored{}, Restart{}, OverlapFallback{}, Fed{}, Done{})
}

// ReportKind is "step".
func (Step) ReportKind() string { return "step" }

// ReportKind is "restored".
func (Restored) ReportKind() string { return "restored" }

// ReportKind is "restart".
func (Restart) ReportKind() string { return "restart" }

// ReportKind is "overlap_fallback".
func (OverlapFallback) ReportKind() string { return "overlap_fallback" }

// ReportKind is "fed".
func (Fed) ReportKind() string { return "fed" }

// ReportKind is "done".
func (Done) ReportKind() string { return "done" }

// Event is step: a replayed step's generation is the one that trained it.
func (r Step) Event(int) (string, []events.Field) {
	return "step", []events.Field{events.F("step", r.Step), events.F("generation", cmp.Or(r.TrainedIn, r.Generation)), events.F("world", r.World),
		events.F("loss", r.Loss), events.F("samples_per_s", r.SamplesPS),
		events.F("step_s", r.StepS), events.F("compute_s", r.ComputeS), events.F("comm_s", r.CommS),
		events.F("epoch", r.Epoch), events.F("offset", r.Offset), events.F("fingerprint", r.Fingerprint),
		events.F("participants", cmp.Or(r.Participants, r.World)), events.F("stale", r.Stale)}
}

// Event is data_plane: how the new ring's rank 0 reaches its peers. (The
// launcher tells the resumption itself, restored, once it has read the
// generation.)
func (r Restored) Event(int) (string, []events.Field) {
	return "data_plane", []events.Field{events.F("generation", r.Generation), events.F("world", r.World), events.F("plane", r.DataPlane)}
}

// Event is rank_restarted.
func (r Restart) Event(int) (string, []events.Field) {
	return "rank_restarted", []events.Field{events.F("rank", r.Rank), events.F("committed_step", r.Step),
		events.F("reason", r.Reason), events.F("restarts", r.Restarts)}
}

// Event is hybrid_overlap_fallback.
func (r OverlapFallback) Event(int) (string, []events.Field) {
	return "hybrid_overlap_fallback", []events.Field{events.F("step", r.Step), events.F("late", r.Late), events.F("deadline_s", r.DeadlineS)}
}

// Event is straggler_fed.
func (r Fed) Event(int) (string, []events.Field) {
	return "straggler_fed", []events.Field{events.F("id", r.ID), events.F("step", r.Step)}
}

// Event is done.
func (r Done) Event(int) (string, []events.Field) {
	fields := []events.Field{events.F("step", r.Step), events.F("accuracy", r.Accuracy), events.F("loss", r.Loss),
		events.F("generation", r.Generation), events.F("world", r.World), events.F("parameters_identical", r.Identical),
		events.F("parameters_crc32c", r.ParamsCRC), events.F("parameters_crc32c_by_rank", r.RankCRCs)}
	for _, k := range slices.Sorted(maps.Keys(r.Metrics)) {
		fields = append(fields, events.F(k, r.Metrics[k]))
	}
	return "done", fields
}

// Text is a progress line, when one is due.
func (r Step) Text(p *job.Progress) string {
	if r.Replayed {
		return ""
	}
	rate, due := p.Due(r.Step, r.SamplesPS, r.StepS)
	if !due {
		return ""
	}
	line := fmt.Sprintf("step %d/%d  loss %.4f  acc %5.1f%%  %d workers", r.Step, p.Steps, r.Loss, 100*r.Accuracy, r.World)
	if rate >= 0 {
		line += fmt.Sprintf("  %.0f samples/s", rate)
	}
	return line + "\n"
}

// Text says where the new ring resumed.
func (r Restored) Text(*job.Progress) string {
	return fmt.Sprintf("generation %d: rank 0 of %d workers, at step %d (%d redone), over %s\n", r.Generation, r.World, r.Step, r.Redone, r.DataPlane)
}

// Text says which rank restarted.
func (r Restart) Text(*job.Progress) string {
	return fmt.Sprintf("rank %d restarted by its supervisor (%s); resumed from the commit of step %d\n", r.Rank, r.Reason, r.Step)
}

// Text gives the held-out measures.
func (r Done) Text(*job.Progress) string {
	var more string
	for _, k := range slices.Sorted(maps.Keys(r.Metrics)) {
		more += fmt.Sprintf(", %s %.4f", k, r.Metrics[k])
	}
	return fmt.Sprintf("done: step %d on %d workers; held-out loss %.4f, accuracy %.2f%%%s\n", r.Step, r.World, r.Loss, 100*r.Accuracy, more)
}
