package phalanx

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/phalanx-rt/phalanx/hang"
	"github.com/phalanx-rt/phalanx/internal/services"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/pipeline"
	"github.com/phalanx-rt/phalanx/job/psjob"
	"github.com/phalanx-rt/phalanx/job/ring"
	"github.com/phalanx-rt/phalanx/pki"
	"github.com/phalanx-rt/phalanx/status"
	"github.com/phalanx-rt/phalanx/worker"
)

// The configuration of a job and of its processes (package job defines
// them; these are the same types).
type (
	// Config is a job's configuration, shared by every process of it.
	Config = job.Config
	// SyncConfig: how ranks synchronise (bsp, hybrid, and for parameter
	// servers asp and ssp).
	SyncConfig = job.SyncConfig
	// CheckpointConfig: where and when checkpoints are taken.
	CheckpointConfig = job.CheckpointConfig
	// FaultConfig: faults injected on purpose (tests, demonstrations).
	FaultConfig = job.FaultConfig
	// PSConfig: a parameter-server job's servers and shards.
	PSConfig = job.PSConfig
	// PipelineConfig: a pipeline job's stages, replicas, schedule and
	// cuts.
	PipelineConfig = job.PipelineConfig
	// LaunchConfig is a local job: its Config, its processes and where
	// its progress, logs and events go.
	LaunchConfig = job.LaunchConfig
	// ConfigError names a configuration field and its bad value.
	ConfigError = job.ConfigError
	// SyncMode, Transport, WireDType, Rescale and Stale are the settings
	// spelled as words (their constants are package job's: job.Hybrid,
	// job.TransportTCP, job.WireBF16, ...).
	SyncMode  = job.SyncMode
	Transport = job.Transport
	WireDType = job.WireDType
	Rescale   = job.Rescale
	Stale     = job.Stale
)

// Models and what a job ends with.
type (
	// Registry resolves models by name, and their job kinds.
	Registry = job.Registry
	// ModelSpec is a model that jobs can train by name.
	ModelSpec = job.ModelSpec
	// Option is one option of a model.
	Option = job.Option
	// Options are a model's options by name, its defaults filled in.
	Options = job.Options
	// Task is what a ring worker trains: the user's model and data.
	Task = job.Task
	// Generation is what a generating model makes (ModelSpec.Generate).
	Generation = job.Generation
	// SampleConfig is a generation from a checkpoint (Sample).
	SampleConfig = job.SampleConfig
	// PSModel is a parameter-server model.
	PSModel = job.PSModel
	// PSWorker is what a parameter-server model's loop works with.
	PSWorker = job.PSWorker
	// PipelineModel is a pipeline model: ordered layers a pipeline cuts
	// into stages, and its data (ModelSpec{Kind: "pipeline", Impl:
	// &PipelineModel{...}}).
	PipelineModel = pipeline.Model
	// PipelineLayer describes one layer of a PipelineModel.
	PipelineLayer = pipeline.Layer
	// Dataset is indexed training data (a Task's, a PipelineModel's).
	Dataset = worker.Dataset
	// Result is how a job ended, as a worker saw it.
	Result = job.Result
	// StoppedError: the job stopped before its last step.
	StoppedError = job.StoppedError
	// Report is what a worker tells of itself, one type per kind of
	// report: the common ones below, job/ring's (ring.Step, ring.Restored,
	// ring.Done, ...) and job/psjob's.
	Report = job.Report
	// Registered: a worker registered with the job's coordinator.
	Registered = job.Registered
	// Training: a rank starts training in a generation's ring.
	Training = job.Training
	// CheckpointReport: a checkpoint was saved, failed, skipped or restored.
	CheckpointReport = job.Checkpoint
	// Stopped: the job stopped, after its final checkpoint.
	Stopped = job.Stopped
	// Left: a worker left the job on request.
	Left = job.Left
	// Failed is a worker's last word: why it failed.
	Failed = job.Failed
)

// ErrLeft is RunWorker's answer when its context was cancelled and the
// worker left the job gracefully: the others go on without it.
var ErrLeft = job.ErrLeft

// DefaultConfig is a job's configuration with every default set.
func DefaultConfig() Config { return job.DefaultConfig() }

// DefaultLaunchConfig is a job of two workers on DefaultConfig.
func DefaultLaunchConfig() LaunchConfig { return job.DefaultLaunchConfig() }

// NewRegistry holds specs, whose kinds are the built-in ones: a ring model
// (New), a parameter-server model (PS) and a pipeline model (Kind
// "pipeline", Impl a *PipelineModel). Registry.AddKind adds others. A
// spec without a name, with both or neither of New and PS (unless it names
// its Kind), or a name given twice is a programming error: it panics.
func NewRegistry(specs ...ModelSpec) *Registry {
	return job.NewRegistry([]job.Kind{ring.Kind{}, psjob.Kind{}, pipeline.Kind{}}, specs...)
}

// Launch runs a local job to its end: the job's etcd (embedded unless
// Config.Etcd names a cluster), and the processes of its kind, each a
// re-execution of this program, which must call Main first thing. A ring
// model trains data-parallel over elastic workers; a parameter-server
// model over PSConfig.Servers servers and Workers workers. Progress goes
// to Output, events to Events. Cancelling ctx stops the job: with
// checkpoints, at the next step boundary after a final one (a
// *StoppedError: the same launch resumes), otherwise at once.
func Launch(ctx context.Context, lc LaunchConfig) (*Result, error) { return job.Launch(ctx, lc) }

// RunWorker runs one elastic worker of job cfg.Job, training task: it
// registers in the job's etcd (cfg.Etcd), trains in every generation the
// coordinator puts it in (BSP or hybrid steps, straggler exclusion and
// readmission, checkpoints and resume), and survives the loss or arrival
// of others. It returns when the job is done. Cancelling ctx makes the
// worker leave the job gracefully (ErrLeft): the ring shrinks and the
// others go on. A stop of the whole job (Stop) is a *StoppedError.
func RunWorker(ctx context.Context, cfg Config, task Task) (*Result, error) {
	return ring.RunWorker(ctx, cfg, task)
}

// RunModel runs one worker of a job whose model is a registered one, in
// its kind's worker role: a ring worker (RunWorker with the model's task)
// or a parameter-server worker (cfg.Index names it).
func RunModel(ctx context.Context, cfg Config, reg *Registry) (*Result, error) {
	return job.RunModel(ctx, cfg, reg)
}

// RunPSServer runs one parameter server of a parameter-server job until
// the job is done or ctx ends; onReady, when set, is told its data-plane
// address once it serves.
func RunPSServer(ctx context.Context, cfg Config, id string, onReady func(addr string)) error {
	return psjob.RunServer(ctx, cfg, id, onReady)
}

// ReportLines writes reports as JSON lines to w: how a launched worker
// tells its launcher (for Config.Reports).
func ReportLines(w io.Writer) func(Report) { return job.ReportLines(w) }

// ReportText writes reports as plain lines to w, for a person watching one
// worker: what it registered as, its generations, a progress line every
// every steps of the job's steps, its restarts, checkpoints and end.
func ReportText(w io.Writer, steps, every int64) func(Report) { return job.ReportText(w, steps, every) }

// Main makes this process one of a job's when a launcher started it as
// one (Launch re-executes the program with the process's spec in its
// environment): it runs the process's role with the models of reg and
// exits with its status. Otherwise it returns at once. Call it first in
// main, before anything else reads flags or starts work:
//
//	func main() {
//		reg := phalanx.NewRegistry(myModel())
//		phalanx.Main(reg)
//		... // the program itself, which may call phalanx.Launch
//	}
//
// In a worker, SIGTERM or SIGINT makes it leave the job gracefully (the
// others go on); a second one ends it at once.
func Main(reg *Registry) {
	raw, ok := os.LookupEnv(job.WorkerEnv)
	if !ok {
		return
	}
	os.Unsetenv(job.WorkerEnv) // not inherited by what the process starts
	roles := map[string]job.Service{"etcd-member": services.Run, "coordinator": services.Run}
	os.Exit(job.RunProcess(raw, reg, roles, os.Stdout, os.Stderr))
}

// CoordinatorConfig configures a standalone coordinator of a job.
type CoordinatorConfig = job.CoordinatorConfig

// RunCoordinator runs a coordinator until the job is done or ctx ends: it
// campaigns in an etcd election and, while it leads, decides the job's
// generations. Run several for standbys.
func RunCoordinator(ctx context.Context, cfg CoordinatorConfig) error {
	return job.RunCoordinator(ctx, cfg)
}

// Stop asks every worker of a running job to stop at the next step
// boundary after a final checkpoint (a job without checkpoints ignores
// it). Each worker then ends with a *StoppedError; the same configuration
// resumes the job.
func Stop(ctx context.Context, a Access, reason string) error {
	return job.Stop(ctx, a, reason)
}

// Access is how a tool reaches a running job's records: its etcd
// endpoints, its name, and its TLS files (TLSFiles) when its etcd
// requires them.
type Access = job.Access

// TLSFiles name a process's mutual TLS material: the job's CA, its
// certificate (naming the job) and its key (Config.TLS).
type TLSFiles = pki.Files

// StatusSnapshot is a job's status: its state, ring and generations,
// workers, excluded stragglers, loss curve, checkpoints and last events.
type StatusSnapshot = status.Snapshot

// JobStatus reads a running job's status from its etcd: the snapshot its
// launcher published last (every two seconds), or, for workers started by
// hand without a launcher, the ring the coordinator decided.
func JobStatus(ctx context.Context, a Access) (StatusSnapshot, error) {
	return job.JobStatus(ctx, a)
}

// ServeStatus serves the live status page of a job started elsewhere on
// addr, read from its etcd, until ctx ends; onServing is told the address.
func ServeStatus(ctx context.Context, a Access, addr string, onServing func(addr string)) error {
	return job.ServeStatus(ctx, a, addr, onServing)
}

// WriteStatus prints a job's status as tables (phalanx status).
func WriteStatus(w io.Writer, s StatusSnapshot) error { return status.WriteTable(w, s, time.Now()) }

// HangFinding is the analysis of a generation's failed collective
// operation: the rank at fault, in one line.
type HangFinding = hang.Finding

// AnalyzeHangs reads a job's saved event log (its collective_dump events)
// and names, for each generation whose collectives failed, the rank at
// fault: the one that never entered the operation the others hung in, or
// entered another (phalanx debug hang).
func AnalyzeHangs(eventsFile string) ([]HangFinding, error) {
	f, err := os.Open(eventsFile)
	if err != nil {
		return nil, fmt.Errorf("phalanx: %w", err)
	}
	defer f.Close()
	return hang.FromEvents(f)
}

// ParsePipelineCuts reads a --pp-cuts value for pipeline model name of
// reg with options opts: layer indices or layer names, comma-separated.
func ParsePipelineCuts(s, name string, opts map[string]string, reg *Registry) ([]int, error) {
	return pipeline.ParseCuts(s, name, opts, reg)
}
