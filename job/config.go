package job

import (
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/failure"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/metrics"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/pki"
	"github.com/phalanx-rt/phalanx/trace"
)

// Config is a job as one of its processes sees it. Start from
// DefaultConfig; every worker of a job must be given the same training
// fields (a worker whose configuration differs is refused by name). The
// fields marked "this process" are not shared: each process sets its own.
type Config struct {
	// Job names the job: its keys in etcd live under /phalanx/<Job>/.
	Job string `json:"job"`
	// Etcd lists the endpoints of the job's etcd cluster. A worker needs
	// them; Launch starts an embedded etcd server when there are none.
	Etcd []string `json:"etcd,omitempty"`
	// EtcdDialTimeout bounds how long a process waits for etcd's first
	// answer, saying every few seconds what it waits for (this process; 0:
	// 30s).
	EtcdDialTimeout time.Duration `json:"etcd_dial_timeout"`
	// Model names what is trained: a Registry entry for Launch, Main and
	// the command; with RunWorker and a Task in hand, a label recorded in
	// checkpoints (a checkpoint of another model is refused).
	Model string `json:"model"`
	// ModelOptions are the model's own options by name (see ModelSpec).
	ModelOptions map[string]string `json:"model_options,omitempty"`

	Steps        int64              `json:"steps"`         // the job's total number of steps
	Batch        int                `json:"batch"`         // global batch: samples per step across all workers
	Optimizer    nn.OptimizerConfig `json:"optimizer"`     // the workers' optimizer
	Schedule     nn.Schedule        `json:"schedule"`      // the learning rate; a cosine schedule's Total defaults to Steps
	ClipNorm     float64            `json:"clip_norm"`     // clip gradients to this global L2 norm (0: off)
	MicroBatches int                `json:"micro_batches"` // gradient accumulation: micro-batches per worker per step
	LocalSteps   int                `json:"local_steps"`   // 1: average gradients every step; K > 1: local SGD, average parameters every K
	CommitEvery  int                `json:"commit_every"`  // commit the state in memory every this many steps
	BucketBytes  int                `json:"bucket_bytes"`  // gradient fusion bucket size
	// MaxMemory bounds a worker's training state (parameters, gradients,
	// optimizer slots) in bytes: a model that needs more is refused
	// before any worker starts (0: no budget).
	MaxMemory int64         `json:"max_memory,omitempty"`
	Seed      uint64        `json:"seed"`       // of the weights, the data and the shuffle
	OpTimeout time.Duration `json:"op_timeout"` // deadline of every collective operation
	// Transport is the data plane between ranks: "auto" (shared memory
	// between ranks on one host, TCP between hosts, hierarchical allreduce
	// when every host has several ranks), "tcp" or "shm" (every rank on one
	// host).
	Transport Transport `json:"transport"`
	// WireDType is the type gradients travel in: "float32" (exact), or
	// "fp16" / "bf16" (half the bytes; reduced in float32). ErrorFeedback
	// keeps each step's rounding residue and adds it to the next step's
	// gradient.
	WireDType     WireDType `json:"wire_dtype"`
	ErrorFeedback bool      `json:"error_feedback"`
	// Rescale says what a change of world size keeps: "batch" (the global
	// batch, re-split) or "lr" (each worker's share, Batch/ReferenceWorld,
	// with the learning rate scaled by world/ReferenceWorld).
	Rescale        Rescale `json:"rescale"`
	ReferenceWorld int     `json:"reference_world"`

	Sync       SyncConfig       `json:"sync"`
	Checkpoint CheckpointConfig `json:"checkpoint"`
	// LeaseTTL: a frozen or partitioned worker is removed this long after
	// its last keep-alive. Unreachable: how long a worker trains on without
	// etcd, or waits for a decision after its ring broke, before it fails.
	LeaseTTL    time.Duration `json:"lease_ttl"`
	Unreachable time.Duration `json:"unreachable"`
	// Restarts bounds the supervised actors' restarts: a rank failing more
	// often ends its worker.
	Restarts actors.Budget `json:"restarts"`
	Faults   FaultConfig   `json:"faults"`
	// PS configures a parameter-server job (a model with ModelSpec.PS).
	PS PSConfig `json:"ps"`
	// Pipeline configures a pipeline job (a model of kind pipeline).
	Pipeline PipelineConfig `json:"pipeline"`

	// TLS is the job's mutual TLS: PEM files of the job's CA, this
	// process's certificate (naming the job: pki.JobURI) and its key; all
	// three or none. With them every plane of this process — the data
	// plane, the parameter servers', the actor remote, etcd — speaks TLS
	// and refuses plaintext. The paths travel to launched processes; the
	// key's bytes never do.
	TLS pki.Files `json:"tls,omitempty"`

	// This process: its data-plane listen address (host:port; port 0
	// picks one), its preferred place in the first ring (-1: none), its
	// index among the workers its launcher started (for Faults), and its
	// S3 credentials (empty: from the environment).
	Bind string `json:"-"`
	// Advertise is the data-plane address peers dial when it is not the
	// bound one (a proxy in front); "": the bound one.
	Advertise   string                 `json:"-"`
	RankHint    int                    `json:"-"`
	Index       int                    `json:"-"`
	Credentials checkpoint.Credentials `json:"-"`
	// This process: its logger (nil: none), its clock (nil: time.Now), and
	// where its reports go (nil: nowhere). A launched worker's reports go
	// to its launcher, which turns them into the job's events.
	Logger  *zap.Logger      `json:"-"`
	Now     func() time.Time `json:"-"`
	Reports func(Report)     `json:"-"`
	// Metrics: this process serves its Prometheus metrics (docs/metrics.md)
	// on /metrics, /healthz and /readyz at this address (host:port; port
	// 0 picks one; "": none), and reports it (Serving). A launcher's own
	// address is LaunchConfig.Metrics.
	Metrics string `json:"-"`
	// Observe is this process's metrics, made by StartMetrics (nil: none).
	Observe *metrics.Set `json:"-"`
	// Tracer records this process's spans (trace timelines; nil: none). A
	// launched process is given a file by its launcher (LaunchConfig.Trace).
	Tracer *trace.Recorder `json:"-"`
}

// SyncConfig chooses how a step waits for the workers.
type SyncConfig struct {
	// Mode is "bsp" (every step waits for every worker) or "hybrid" (a step
	// closes when all are ready or at its deadline once a Quorum is; late
	// workers' gradients are stale). Parameter-server jobs also take "asp"
	// and "ssp".
	Mode SyncMode `json:"mode"`
	// Deadline is hybrid's fixed step deadline; 0 makes it adaptive:
	// DeadlineFactor × the median of recent steps.
	Deadline       time.Duration `json:"deadline"`
	DeadlineFactor float64       `json:"deadline_factor"`
	Quorum         float64       `json:"quorum"`
	// Stale is what a late worker does with its gradients: "drop", or
	// "decay" (add them, scaled by StaleDecay, to its next step's).
	Stale      Stale   `json:"stale"`
	StaleDecay float64 `json:"stale_decay"`
	// A worker late in ExcludeAfter of its last ExcludeWindow steps is
	// excluded (0/0: never) and readmitted once its own steps would have
	// met the deadline ReadmitAfter times in a row.
	ExcludeAfter  int `json:"exclude_after"`
	ExcludeWindow int `json:"exclude_window"`
	ReadmitAfter  int `json:"readmit_after"`
	// Staleness bounds how many clocks a parameter-server worker may run
	// ahead of the slowest ("ssp").
	Staleness int `json:"staleness"`
}

// CheckpointConfig says where and how often a job checkpoints.
type CheckpointConfig struct {
	// Location is a directory or s3://bucket/prefix?endpoint=host:port
	// (see checkpoint.ParseLocation); "" : no checkpoints. A job whose
	// store holds checkpoints resumes from the newest that verifies.
	Location   string        `json:"location,omitempty"`
	EverySteps int64         `json:"every_steps"` // 0: not by steps
	Every      time.Duration `json:"every"`       // 0: not by time
	KeepLast   int           `json:"keep_last"`   // newest kept (0: all)
	KeepEvery  int           `json:"keep_every"`  // also every this-many-th (0: none)
	// Wait bounds how long training waits for the previous upload when the
	// next checkpoint is due, and for the final one.
	Wait time.Duration `json:"wait"`
	// Resume requires a checkpoint to resume from.
	Resume bool `json:"resume"`
}

// FaultConfig injects faults, for tests and benchmarks; workers need not
// agree on it.
type FaultConfig struct {
	// FailWorker (an Index; -1: none) panics in its model code at FailStep,
	// FailTimes times in a row; its supervisor restarts the rank actor.
	FailWorker int   `json:"fail_worker"`
	FailStep   int64 `json:"fail_step"`
	FailTimes  int   `json:"fail_times"`
	// Inject slows down or pauses ring ranks' model code.
	Inject failure.Injection `json:"inject"`
}

// PSConfig configures a parameter-server job.
type PSConfig struct {
	Servers   int     `json:"servers"`   // server processes
	Shards    int     `json:"shards"`    // 0: one per server
	Replicas  int     `json:"replicas"`  // backups of each shard; -1: 1 with two servers or more
	Partition string  `json:"partition"` // how keys split between shards: range or hash
	Optimizer string  `json:"optimizer"` // the servers' optimizer: sgd, adagrad or adam
	LR        float64 `json:"lr"`        // the servers' learning rate
	// CacheRows are rows each worker caches (0: none), for CacheStaleness
	// clocks after they were pulled.
	CacheRows      int   `json:"cache_rows"`
	CacheStaleness int64 `json:"cache_staleness"`
	ReportEvery    int   `json:"report_every"` // steps between progress reports (0: a twentieth of the job)
}

// PipelineConfig configures a pipeline job: Replicas (D) copies of a
// pipeline of Stages (P) processes, D·P workers in all. MicroBatches is
// the number of micro-batches a replica's share of a step is cut into.
type PipelineConfig struct {
	Stages   int `json:"stages"`   // P, processes per replica (--pp; with Tensor set, Tensor)
	Replicas int `json:"replicas"` // D, pipeline replicas (--dp)
	// Tensor is T, tensor-parallel ranks per replica (--tp): when set (1
	// or more) the job's model is built split across them
	// (ModelSpec.Split) on the pipeline kind, each replica T processes
	// (Stages is set to T; pipeline stages and tensor parallelism together
	// are not supported yet); 0 leaves a ring model to the ring.
	Tensor   int    `json:"tensor,omitempty"`
	Schedule string `json:"schedule"` // gpipe, 1f1b, interleaved or zb-h1
	Chunks   int    `json:"chunks"`   // v, model chunks per stage (interleaved; 0: 2 there, else 1)
	// Cuts are the first layer of stages 1.. (of virtual stages under
	// interleaved); empty: balanced by Balance.
	Cuts []int `json:"cuts,omitempty"`
	// Balance is how cuts are chosen when none are given: "params"
	// (parameter count) or "time" (measured forward+backward time of each
	// layer, by the launcher).
	Balance string `json:"balance"`
	// Recompute keeps only each micro-batch's stage input and runs the
	// forward again before the backward.
	Recompute bool `json:"recompute"`
}

// DefaultConfig is the configuration `phalanx train` starts from: 300
// steps of a 256-sample global batch, momentum SGD at 0.05 with a cosine
// schedule, BSP, no checkpoints.
func DefaultConfig() Config {
	return Config{
		Steps:        300,
		Batch:        256,
		Optimizer:    nn.OptimizerConfig{Kind: "momentum", Momentum: 0.9},
		Schedule:     nn.Schedule{Kind: "cosine", Base: 0.05, Warmup: 10, Every: 100, Gamma: 0.1},
		MicroBatches: 1,
		LocalSteps:   1,
		CommitEvery:  1,
		BucketBytes:  1 << 20,
		Seed:         1,
		ModelOptions: map[string]string{},
		OpTimeout:    30 * time.Second,
		Transport:    "auto",
		WireDType:    "float32",
		Rescale:      "batch",
		Sync: SyncConfig{Mode: "bsp", DeadlineFactor: 2, Quorum: 0.75, Stale: "drop", StaleDecay: 0.5,
			ExcludeAfter: 5, ExcludeWindow: 10, ReadmitAfter: 5, Staleness: 3},
		Checkpoint:      CheckpointConfig{KeepLast: 3, Wait: 2 * time.Minute},
		LeaseTTL:        5 * time.Second,
		Unreachable:     time.Minute,
		EtcdDialTimeout: 30 * time.Second,
		Restarts:        actors.DefaultBudget(),
		Faults:          FaultConfig{FailWorker: -1, FailTimes: 1},
		PS: PSConfig{Servers: 2, Replicas: -1, Partition: "hash", Optimizer: "adagrad", LR: 0.2,
			CacheStaleness: 1},
		Pipeline: PipelineConfig{Stages: 1, Replicas: 1, Schedule: "1f1b", Balance: "params"},
		Bind:     "127.0.0.1:0",
		RankHint: -1,
		Index:    -1,
	}
}

// ConfigError names a configuration field and its Invalid value.
type ConfigError struct {
	Field  string // as in Config, dotted: "Sync.Quorum"
	Value  any    // the field's value, as set ("" for an empty string)
	Reason string
	Err    error // the cause, when there is one
}

// Error names the field, its value and the problem.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("phalanx: %s %s: %s", e.Field, e.ValueText(), e.Reason)
}

// ValueText is the value as messages show it: an empty string as "".
func (e *ConfigError) ValueText() string {
	if s, ok := e.Value.(string); ok && s == "" {
		return `""`
	}
	return fmt.Sprint(e.Value)
}

// Unwrap is the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

func Invalid(field string, value any, format string, args ...any) error {
	return &ConfigError{Field: field, Value: value, Reason: fmt.Sprintf(format, args...)}
}

// WorkerDefaults fills what a worker process of any kind needs and its
// embedder may leave out: a logger (none), the clock, and a bind address
// on loopback chosen by the system.
func (c *Config) WorkerDefaults() {
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Bind == "" {
		c.Bind = "127.0.0.1:0"
	}
}

// CheckJoin refuses a worker's configuration that names no job to join
// or no etcd to join it through.
func (c *Config) CheckJoin() error {
	switch {
	case c.Job == "":
		return Invalid("Job", "", "a worker joins a named job")
	case len(c.Etcd) == 0:
		return Invalid("Etcd", c.Etcd, "a worker joins a job through its etcd: give the endpoints")
	}
	return nil
}

// Validate checks a ring job's configuration; the first problem is
// returned as a *ConfigError.
func (c *Config) Validate() error {
	if err := c.ValidateCommon(); err != nil {
		return err
	}
	switch {
	case c.Batch < 1:
		return Invalid("Batch", c.Batch, "want at least 1")
	case c.MicroBatches < 1:
		return Invalid("MicroBatches", c.MicroBatches, "want at least 1")
	case c.LocalSteps < 1:
		return Invalid("LocalSteps", c.LocalSteps, "want at least 1")
	case c.CommitEvery < 1:
		return Invalid("CommitEvery", c.CommitEvery, "want at least 1")
	case c.BucketBytes < 1:
		return Invalid("BucketBytes", c.BucketBytes, "want a positive size")
	case c.ClipNorm < 0:
		return Invalid("ClipNorm", c.ClipNorm, "must not be negative")
	case c.OpTimeout <= 0:
		return Invalid("OpTimeout", c.OpTimeout, "must be positive")
	case c.Transport != "auto" && c.Transport != "tcp" && c.Transport != "shm":
		return Invalid("Transport", c.Transport, `want "auto", "tcp" or "shm"`)
	case c.WireDType != "float32" && c.WireDType != "fp16" && c.WireDType != "bf16":
		return Invalid("WireDType", c.WireDType, `want "float32", "fp16" or "bf16"`)
	case c.ErrorFeedback && c.WireDType == "float32":
		return Invalid("ErrorFeedback", c.ErrorFeedback, `needs a compressed WireDType ("fp16" or "bf16")`)
	case c.Rescale != "batch" && c.Rescale != "lr":
		return Invalid("Rescale", c.Rescale, `want "batch" or "lr"`)
	case c.ReferenceWorld < 0 || (c.Rescale == "lr" && c.ReferenceWorld > c.Batch):
		return Invalid("ReferenceWorld", c.ReferenceWorld, "want 1..Batch")
	case c.Restarts.MaxRestarts < 0:
		return Invalid("Restarts.MaxRestarts", c.Restarts.MaxRestarts, "must not be negative")
	case c.Restarts.Window <= 0:
		return Invalid("Restarts.Window", c.Restarts.Window, "must be positive")
	case c.Faults.FailWorker >= 0 && c.Faults.FailStep < 1:
		return Invalid("Faults.FailStep", c.Faults.FailStep, "want a step from 1")
	case c.Faults.FailTimes < 0:
		return Invalid("Faults.FailTimes", c.Faults.FailTimes, "must not be negative")
	}
	if err := c.LRSchedule().Validate(); err != nil {
		return Invalid("Schedule", c.Schedule.Kind, "%v", err)
	}
	if _, err := nn.NewOptimizer(c.Optimizer, nil); err != nil {
		return Invalid("Optimizer.Kind", c.Optimizer.Kind, "%v", err)
	}
	if c.Sync.Mode != "bsp" && c.Sync.Mode != "hybrid" {
		return Invalid("Sync.Mode", c.Sync.Mode, `want "bsp" or "hybrid" (asp and ssp are for parameter-server jobs)`)
	}
	if c.Sync.Mode == "hybrid" {
		if _, err := c.Sync.Policy(); err != nil {
			return err
		}
	}
	return nil
}

// ValidateCommon checks what every job kind has.
func (c *Config) ValidateCommon() error {
	switch {
	case c.Job != "" && strings.ContainsAny(c.Job, "/\x00"):
		return Invalid("Job", c.Job, "want a name without '/'")
	case c.Model == "":
		return Invalid("Model", "", "name the model")
	case c.Steps < 1:
		return Invalid("Steps", c.Steps, "want at least 1")
	case c.MaxMemory < 0:
		return Invalid("MaxMemory", c.MaxMemory, "must not be negative (0: no budget)")
	case c.LeaseTTL < time.Second:
		return Invalid("LeaseTTL", c.LeaseTTL, "want at least 1s (etcd leases count whole seconds)")
	case c.Unreachable <= 0:
		return Invalid("Unreachable", c.Unreachable, "must be positive")
	case c.EtcdDialTimeout < 0:
		return Invalid("EtcdDialTimeout", c.EtcdDialTimeout, "must not be negative (0: 30s)")
	}
	if err := c.TLS.Validate(); err != nil {
		return Invalid("TLS", c.TLS, "%v", err)
	}
	for _, e := range c.Etcd {
		if strings.TrimSpace(e) == "" || strings.ContainsAny(e, ", ") {
			return Invalid("Etcd", c.Etcd, "want a list of host:port endpoints")
		}
	}
	return c.Checkpoint.validate()
}

func (k CheckpointConfig) validate() error {
	switch {
	case k.Location == "" && (k.EverySteps != 0 || k.Every != 0 || k.Resume):
		return Invalid("Checkpoint.Location", "", "Checkpoint.EverySteps, Checkpoint.Every and Checkpoint.Resume need a location")
	case k.EverySteps < 0:
		return Invalid("Checkpoint.EverySteps", k.EverySteps, "must not be negative")
	case k.Every < 0:
		return Invalid("Checkpoint.Every", k.Every, "must not be negative")
	case k.KeepLast < 0:
		return Invalid("Checkpoint.KeepLast", k.KeepLast, "must not be negative")
	case k.KeepEvery < 0:
		return Invalid("Checkpoint.KeepEvery", k.KeepEvery, "must not be negative")
	case k.Wait <= 0:
		return Invalid("Checkpoint.Wait", k.Wait, "must be positive")
	}
	if k.Location != "" {
		l, err := checkpoint.ParseLocation(k.Location)
		if err != nil {
			return Invalid("Checkpoint.Location", k.Location, "%v", err)
		}
		if l.Dir != "" {
			if fi, err := os.Stat(l.Dir); err == nil && !fi.IsDir() {
				return Invalid("Checkpoint.Location", k.Location, "is a file, not a directory")
			}
		}
	}
	return nil
}

// Policy is the hybrid decisions' configuration.
func (s SyncConfig) Policy() (hybrid.Policy, error) {
	p := hybrid.Policy{AutoFactor: s.DeadlineFactor, Quorum: s.Quorum, ReadmitAfter: s.ReadmitAfter, MinWorkers: 1,
		ExcludeAfter: s.ExcludeAfter, Window: s.ExcludeWindow}
	switch {
	case s.Deadline < 0:
		return p, Invalid("Sync.Deadline", s.Deadline, "want a positive duration, or 0 for an adaptive one")
	case s.Deadline == 0:
		p.Auto, p.Deadline = true, 2*time.Second // until the first steps are timed
	default:
		p.Deadline = s.Deadline
	}
	switch {
	case s.ExcludeAfter < 0 || s.ExcludeWindow < s.ExcludeAfter || (s.ExcludeAfter == 0) != (s.ExcludeWindow == 0):
		return p, Invalid("Sync.ExcludeAfter", fmt.Sprintf("%d/%d", s.ExcludeAfter, s.ExcludeWindow), "want X/W with 1 <= X <= W, or 0/0 for never")
	case s.Stale != "drop" && s.Stale != "decay":
		return p, Invalid("Sync.Stale", s.Stale, `want "drop" or "decay"`)
	case s.Stale == "decay" && !(s.StaleDecay > 0 && s.StaleDecay <= 1):
		return p, Invalid("Sync.StaleDecay", s.StaleDecay, "want a factor in (0, 1]")
	}
	if err := p.Validate(); err != nil {
		return p, Invalid("Sync", s.Mode, "%v", err)
	}
	return p, nil
}

// Collective is the collective type of a validated wire type: 0 for
// float32, the gradients' own type.
func (s WireDType) Collective() collective.DType {
	switch s {
	case "fp16":
		return collective.Float16
	case "bf16":
		return collective.BFloat16
	}
	return 0
}

// LRSchedule is the learning-rate schedule with a cosine's end at Steps when
// not given.
func (c *Config) LRSchedule() nn.Schedule {
	s := c.Schedule
	if s.Kind == "cosine" && s.Total == 0 {
		s.Total = max(c.Steps, s.Warmup+1)
	}
	return s
}

// SyncMode is how a step waits for the workers (SyncConfig.Mode).
type SyncMode string

// The synchronisation modes: a ring job takes bsp and hybrid, a
// parameter-server job all four (async is asp).
const (
	BSP    SyncMode = "bsp"
	Hybrid SyncMode = "hybrid"
	ASP    SyncMode = "asp"
	Async  SyncMode = "async"
	SSP    SyncMode = "ssp"
)

// Transport is a ring's data plane (Config.Transport).
type Transport string

// The data planes.
const (
	TransportAuto Transport = "auto"
	TransportTCP  Transport = "tcp"
	TransportShm  Transport = "shm"
)

// WireDType is the type gradients travel in (Config.WireDType).
type WireDType string

// The wire types.
const (
	WireFloat32 WireDType = "float32"
	WireFP16    WireDType = "fp16"
	WireBF16    WireDType = "bf16"
)

// Rescale is what a change of world size keeps (Config.Rescale).
type Rescale string

// The rescale policies.
const (
	RescaleBatch Rescale = "batch"
	RescaleLR    Rescale = "lr"
)

// Stale is what a late worker does with its gradients (SyncConfig.Stale).
type Stale string

// The stale-gradient policies.
const (
	StaleDrop  Stale = "drop"
	StaleDecay Stale = "decay"
)
