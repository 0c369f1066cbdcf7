package psjob

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/job"
)

// The parameter-server workers' own reports, beside the common ones of
// package job (Failed above all).

// Step: share 0's worker trained to Step of Steps: the mean loss over the
// steps since its last report, the job's examples/s over them, and the
// pushes that missed their step (Stale).
type Step struct {
	Worker    int     `json:"worker"` // the share's index
	Step      int64   `json:"step"`
	Steps     int64   `json:"steps"`
	Epoch     int64   `json:"epoch"`
	Loss      float64 `json:"loss"`
	SamplesPS float64 `json:"samples_per_s"`
	Stale     int     `json:"stale"`
}

// Checkpoint: share 0's worker saved the shards at Step.
type Checkpoint struct {
	Step   int64 `json:"step"`
	Steps  int64 `json:"steps"`
	Shards int   `json:"shards"`
}

// Done: share 0's worker finished the job: the model's held-out measures.
type Done struct {
	Steps   int64              `json:"steps"`
	Metrics map[string]float64 `json:"metrics"`
}

// Share is a worker's claim of a data share: its own, or one adopted from
// a worker that died.
type Share struct {
	Worker int   `json:"worker"` // the claiming worker's index
	Pid    int   `json:"pid"`
	Share  int   `json:"share"`
	Steps  int64 `json:"steps"` // the job's
	// Reason is own (the worker's own share) or adopted (a share whose
	// worker died).
	Reason string `json:"reason"`
	// From is the step the share resumes after; ReplayedTo the last step
	// some shard already applied (steps From+1..ReplayedTo are pushed
	// again, as duplicates where applied).
	From       int64 `json:"from"`
	ReplayedTo int64 `json:"replayed_to"`
}

// ShareDone: a worker finished a share it claimed; Duplicates is how many
// of its pushes the shards answered as applied already.
type ShareDone struct {
	Share
	Duplicates int64 `json:"duplicates"`
}

// ShardAccount is a parameter-server shard's state at the end of a job: its
// clock, its rows, and the pushes applied from each worker (each once).
type ShardAccount struct {
	Shard  int      `json:"shard"`
	Clock  int64    `json:"clock"`
	Rows   uint64   `json:"rows"`
	Pushes []uint64 `json:"pushes"`
}

// reportTypes are the reports a parameter-server job's workers print.
func reportTypes() job.ReportTypes {
	return job.NewReportTypes(Step{}, Checkpoint{}, Done{}, Share{}, ShareDone{})
}

// ReportKind is "ps_step".
func (Step) ReportKind() string { return "ps_step" }

// ReportKind is "ps_checkpoint".
func (Checkpoint) ReportKind() string { return "ps_checkpoint" }

// ReportKind is "ps_done".
func (Done) ReportKind() string { return "ps_done" }

// ReportKind is "ps_share".
func (Share) ReportKind() string { return "ps_share" }

// ReportKind is "ps_share_done".
func (ShareDone) ReportKind() string { return "ps_share_done" }

// Event is step.
func (r Step) Event(int) (string, []events.Field) {
	return "step", []events.Field{events.F("step", r.Step), events.F("worker", r.Worker), events.F("epoch", r.Epoch), events.F("loss", r.Loss),
		events.F("samples_per_s", r.SamplesPS), events.F("stale", r.Stale)}
}

// Event is checkpoint_saved.
func (r Checkpoint) Event(int) (string, []events.Field) {
	return "checkpoint_saved", []events.Field{events.F("step", r.Step), events.F("shards", r.Shards)}
}

// Event is ps_share.
func (r Share) Event(int) (string, []events.Field) { return "ps_share", r.fields() }

// Event is ps_share_done.
func (r ShareDone) Event(int) (string, []events.Field) {
	return "ps_share_done", append(r.fields(), events.F("steps", r.Steps), events.F("duplicates", r.Duplicates))
}

func (r Share) fields() []events.Field {
	return []events.Field{events.F("share", r.Share), events.F("worker", r.Worker), events.F("pid", r.Pid), events.F("reason", r.Reason),
		events.F("from", r.From), events.F("replayed_to", r.ReplayedTo)}
}

// Text is a progress line, when one is due.
func (r Step) Text(p *job.Progress) string {
	if _, due := p.Due(r.Step, 0, 0); !due {
		return ""
	}
	return fmt.Sprintf("step %d/%d  loss %.4f\n", r.Step, cmp.Or(r.Steps, p.Steps), r.Loss)
}

// text says a checkpoint was saved (the launcher's line).
func (r Checkpoint) text() string {
	return fmt.Sprintf("checkpoint of step %d saved (%d shards)\n", r.Step, r.Shards)
}

// takeover says a share was adopted ("" for a worker's own: the
// launcher's line).
func (r Share) takeover() string {
	if r.Reason == "own" {
		return ""
	}
	return fmt.Sprintf("worker %d took over share %d at step %d\n", r.Worker, r.Share, r.From)
}

// Text gives the held-out measures.
func (r Done) Text(*job.Progress) string {
	return fmt.Sprintf("done: step %d; %s\n", r.Steps, r.metrics())
}

// metrics are the held-out measures in plain words, by name.
func (r Done) metrics() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Metrics)) {
		parts = append(parts, fmt.Sprintf("%s %.4f", k, r.Metrics[k]))
	}
	return strings.Join(parts, ", ")
}
