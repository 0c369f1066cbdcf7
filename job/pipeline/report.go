package pipeline

import (
	"cmp"
	"fmt"
	"hash/crc32"
	"maps"
	"slices"
	"strings"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/worker"
)

// Step: a stage of replica 0 finished a step. The last stage's carries
// the step's loss and accuracy over every replica's samples.
type Step struct {
	Step       int64   `json:"step"`
	Stage      int     `json:"stage"`
	Generation uint64  `json:"generation"`
	Replicas   int     `json:"replicas"`
	BusyS      float64 `json:"busy_s"`    // computing
	ElapsedS   float64 `json:"elapsed_s"` // the whole step
	Bubble     float64 `json:"bubble"`    // 1 − busy/elapsed
	WaitS      float64 `json:"wait_s"`    // waiting for a peer's tensor
	SendS      float64 `json:"send_s"`    // handing tensors to the data plane
	Peak       int     `json:"peak"`      // most micro-batches' activations held at once
	// The stage's memory, from its own accounting: parameters, optimizer
	// slots, and activations (the chunks' caches and the receive
	// buffers).
	ParamBytes int64   `json:"param_bytes"`
	SlotBytes  int64   `json:"slot_bytes"`
	ActBytes   int64   `json:"act_bytes"`
	Loss       float64 `json:"loss,omitempty"`
	Accuracy   float64 `json:"accuracy,omitempty"`
	Samples    int     `json:"samples,omitempty"`
	GradNorm   float64 `json:"grad_norm,omitempty"`
	// The last stage's: the sampler position after the step, the
	// fingerprint of every replica's samples of it, and the workers in
	// replicas (the job's step event, as a ring's).
	Epoch       int64              `json:"epoch,omitempty"`
	Offset      int64              `json:"offset,omitempty"`
	Fingerprint worker.Fingerprint `json:"fingerprint,omitempty"`
	World       int                `json:"world,omitempty"`
	// Replayed: the last stage of a new generation's replica 0 reports
	// again the step its state is of, trained in generation TrainedIn,
	// before its first step there. The replica 0 of then may have been
	// lost before it reported the step (the launcher emits it, as a ring's
	// new rank 0 makes it), or after it applied and reported a later step
	// this replica never finished (the launcher emits restored: that step
	// is trained again). A replay's Replicas are the new generation's.
	Replayed  bool   `json:"replayed,omitempty"`
	TrainedIn uint64 `json:"trained_in,omitempty"`
}

// stepEvent is the job's step event for the last stage's report, with a
// ring's fields (docs/events.md), so that what reads a ring's steps (the
// chaos harness's sample audit and recovery timing) reads a pipeline's. A
// replayed step's generation is the one that trained it.
func (r Step) stepEvent(sink events.Sink) {
	sink.Emit("step", events.F("step", r.Step), events.F("generation", cmp.Or(r.TrainedIn, r.Generation)), events.F("world", r.World),
		events.F("loss", r.Loss), events.F("samples_per_s", float64(r.Samples)/max(r.ElapsedS, 1e-12)), events.F("step_s", r.ElapsedS),
		events.F("compute_s", r.BusyS), events.F("comm_s", r.ElapsedS-r.BusyS), events.F("epoch", r.Epoch), events.F("offset", r.Offset),
		events.F("fingerprint", r.Fingerprint), events.F("participants", r.World), events.F("stale", 0))
}

// Done: a stage of replica 0 reached the job's last step, where replica 0
// measured the model on the held-out data (every stage of it says so; the
// launcher takes the first).
type Done struct {
	Step       int64   `json:"step"`
	Generation uint64  `json:"generation"`
	Replicas   int     `json:"replicas"`
	Loss       float64 `json:"loss"`
	Accuracy   float64 `json:"accuracy"`
	// Metrics are a split model's further held-out measures
	// (job.Task.Measures).
	Metrics map[string]float64 `json:"metrics,omitempty"`
}

// StageDone: a worker's stage at the job's end, a CRC32C of each of its
// parameters by name, so that the launcher can tell whether the replicas
// of each stage ended identical, and name the model whatever the cuts.
type StageDone struct {
	Replica int               `json:"replica"`
	Stage   int               `json:"stage"`
	CRCs    map[string]uint32 `json:"crcs"`
}

// ReportKind is "pipeline_stage_done".
func (StageDone) ReportKind() string { return "pipeline_stage_done" }

// Layout: how a generation placed the workers (replica 0's first stage
// says it). Lost are the (old replica, stage) places no survivor holds.
type Layout struct {
	Generation uint64   `json:"generation"`
	Replicas   int      `json:"replicas"`
	Step       int64    `json:"step"` // the step the kept replicas go on from
	Donor      int      `json:"donor"`
	Dropped    []int    `json:"dropped,omitempty"`
	Formed     []int    `json:"formed,omitempty"`
	Lost       [][2]int `json:"lost,omitempty"`
	Spares     int      `json:"spares"`
}

// ReportKind is "pipeline_layout".
func (Layout) ReportKind() string { return "pipeline_layout" }

// events are the layout's events: stage_lost for each lost stage,
// replica_dropped and replica_formed, and pipeline_layout.
func (r Layout) events(sink events.Sink) {
	for _, l := range r.Lost {
		sink.Emit("stage_lost", events.F("replica", l[0]), events.F("stage", l[1]), events.F("step", r.Step), events.F("generation", r.Generation))
	}
	for _, q := range r.Dropped {
		sink.Emit("replica_dropped", events.F("replica", q), events.F("step", r.Step), events.F("generation", r.Generation))
	}
	for _, q := range r.Formed {
		if r.Donor < 0 && r.Step == 0 {
			break // the job's first replicas
		}
		sink.Emit("replica_formed", events.F("replica", q), events.F("step", r.Step), events.F("generation", r.Generation),
			events.F("donor", r.Donor))
	}
	sink.Emit("pipeline_layout", events.F("generation", r.Generation), events.F("replicas", r.Replicas), events.F("step", r.Step),
		events.F("spares", r.Spares))
}

// Text says what changed, when something did.
func (r Layout) Text(*job.Progress) string {
	if len(r.Dropped) == 0 && (len(r.Formed) == 0 || r.Donor < 0 && r.Step == 0) {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "generation %d: %s from step %d", r.Generation, plural(r.Replicas, "replica"), r.Step)
	for _, l := range r.Lost {
		fmt.Fprintf(&b, "; stage %d of replica %d lost", l[1], l[0])
	}
	if len(r.Dropped) > 0 {
		fmt.Fprintf(&b, "; dropped replicas %v", r.Dropped)
	}
	if len(r.Formed) > 0 && r.Donor >= 0 {
		fmt.Fprintf(&b, "; formed replicas %v from replica %d's parameters", r.Formed, r.Donor)
	}
	if r.Spares > 0 {
		fmt.Fprintf(&b, "; %s waiting", plural(r.Spares, "spare"))
	}
	return b.String() + "\n"
}

// StageRestored: a stage of replica 0 was restored, from another
// member's memory (Source "peer") after the job lost every copy of it, from
// its own commit in memory (Source "commit": the pipeline rolled back), or
// from a checkpoint (Source "checkpoint": the job resumed, or lost a stage
// with its copies), the pipeline rolling back from step Lost to Step.
type StageRestored struct {
	Stage      int    `json:"stage"`
	Source     string `json:"source"`
	Step       int64  `json:"step"`
	Lost       int64  `json:"lost"`
	Generation uint64 `json:"generation"`
}

// ReportKind is "stage_restored".
func (StageRestored) ReportKind() string { return "stage_restored" }

// Event is stage_restored.
func (r StageRestored) Event(int) (string, []events.Field) {
	return "stage_restored", []events.Field{events.F("stage", r.Stage), events.F("source", r.Source), events.F("step", r.Step),
		events.F("steps_redone", r.Lost-r.Step), events.F("generation", r.Generation)}
}

// Text says where the stage came from.
func (r StageRestored) Text(*job.Progress) string {
	return fmt.Sprintf("stage %d restored from the %s of step %d (%d steps redone)\n", r.Stage, r.Source, r.Step, r.Lost-r.Step)
}

// ReportKind is "pipeline_step".
func (Step) ReportKind() string { return "pipeline_step" }

// ReportKind is "pipeline_done".
func (Done) ReportKind() string { return "pipeline_done" }

// Event is pipeline_step.
func (r Step) Event(int) (string, []events.Field) {
	f := []events.Field{events.F("step", r.Step), events.F("stage", r.Stage), events.F("busy", r.BusyS/max(r.ElapsedS, 1e-12)),
		events.F("bubble", r.Bubble), events.F("wait_s", r.WaitS), events.F("send_s", r.SendS),
		events.F("peak_activations", r.Peak), events.F("step_s", r.ElapsedS),
		events.F("generation", r.Generation), events.F("replicas", r.Replicas),
		events.F("param_bytes", r.ParamBytes), events.F("slot_bytes", r.SlotBytes), events.F("activation_bytes", r.ActBytes)}
	if r.Samples > 0 {
		f = append(f, events.F("loss", r.Loss), events.F("accuracy", r.Accuracy), events.F("grad_norm", r.GradNorm))
	}
	return "pipeline_step", f
}

// ending is what the launcher learns of the job's end: replica 0's
// Done and every stage's parameters.
type ending struct {
	done   *Done
	stages []StageDone
	world  int // the workers in replicas: replicas × stages
}

// identical reports whether every replica's stage ended with the same
// parameters as replica 0's, and the CRC32C of the whole model: of its
// parameters' names and CRCs in name order (replica 0's), which does not
// depend on where the cuts are.
func (e *ending) identical() (bool, uint32) {
	ref := map[string]uint32{}
	for _, s := range e.stages {
		if s.Replica == 0 {
			maps.Copy(ref, s.CRCs)
		}
	}
	same := len(ref) > 0
	for _, s := range e.stages {
		for name, c := range s.CRCs {
			same = same && ref[name] == c
		}
	}
	names := slices.Sorted(maps.Keys(ref))
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, n := range names {
		fmt.Fprintf(h, "%s:%08x;", n, ref[n])
	}
	return same, h.Sum32()
}

// event is the done event.
func (e *ending) event(sink events.Sink) {
	same, crc := e.identical()
	d := e.done
	fields := []events.Field{events.F("step", d.Step), events.F("accuracy", d.Accuracy), events.F("loss", d.Loss),
		events.F("generation", d.Generation), events.F("replicas", d.Replicas), events.F("world", e.world),
		events.F("parameters_identical", same), events.F("parameters_crc32c", crc)}
	for _, k := range slices.Sorted(maps.Keys(d.Metrics)) {
		fields = append(fields, events.F(k, d.Metrics[k]))
	}
	sink.Emit("done", fields...)
}

// Text gives the held-out measures.
func (r Done) Text(*job.Progress) string {
	var more string
	for _, k := range slices.Sorted(maps.Keys(r.Metrics)) {
		more += fmt.Sprintf(", %s %.4f", k, r.Metrics[k])
	}
	return fmt.Sprintf("done: step %d on %s; held-out loss %.4f, accuracy %.2f%%%s\n", r.Step, plural(r.Replicas, "replica"), r.Loss, 100*r.Accuracy, more)
}

// stepLine gathers each step's reports from every stage of replica 0 and
// says the progress line when all are in and one is due. The stages'
// reports come from several processes and interleave (a stage may report
// step s+1 before another has reported s), so a few steps are gathered
// at once.
type stepLine struct {
	stages  int
	pending map[int64][]*Step
}

// stepLineWindow bounds the steps gathered at once: a step whose reports
// are still incomplete this far behind the newest is dropped (a stage
// lost in it never reports it).
const stepLineWindow = 64

// add takes a stage's report; it returns the step's reports once every
// stage's has come.
func (l *stepLine) add(r Step) []*Step {
	if r.Stage < 0 || r.Stage >= l.stages {
		return nil
	}
	if l.pending == nil {
		l.pending = map[int64][]*Step{}
	}
	got := l.pending[r.Step]
	if got == nil {
		got = make([]*Step, l.stages)
		l.pending[r.Step] = got
		for s := range l.pending {
			if s < r.Step-stepLineWindow {
				delete(l.pending, s)
			}
		}
	}
	got[r.Stage] = &r
	for _, g := range got {
		if g == nil {
			return nil
		}
	}
	delete(l.pending, r.Step)
	return got
}

// progressText is a step's progress line, when one is due; tensor: the
// replica's processes are tensor-parallel ranks, not stages.
func progressText(p *job.Progress, all []*Step, tensor bool) string {
	last := all[len(all)-1]
	rate, due := p.Due(last.Step, float64(last.Samples)/max(last.ElapsedS, 1e-12), last.ElapsedS)
	if !due {
		return ""
	}
	var busy strings.Builder
	for i, s := range all {
		if i > 0 {
			busy.WriteByte(' ')
		}
		fmt.Fprintf(&busy, "%.2f", s.BusyS/max(s.ElapsedS, 1e-12))
	}
	unit := "stages  stage busy"
	if tensor {
		unit = "tensor-parallel ranks  busy"
	}
	line := fmt.Sprintf("step %d/%d  loss %.4f  acc %5.1f%%  %s × %d %s %s", last.Step, p.Steps, last.Loss,
		100*last.Accuracy, plural(last.Replicas, "replica"), len(all), unit, busy.String())
	if rate >= 0 {
		line += fmt.Sprintf("  %.0f samples/s", rate)
	}
	return line + "\n"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
