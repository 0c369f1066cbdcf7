package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/phalanx-rt/phalanx/checkpoint"
)

// Scenario is a job, and a schedule of faults to run against it. The same
// scenario and seed always give the same schedule (Plan).
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Job is what runs. Configure (package API only) adjusts the launch
	// after Job is applied: an embedder's own registry, model and options.
	Job JobSpec `json:"job"`
	// Faults are injected in the order their triggers fire.
	Faults []FaultSpec `json:"faults"`
	// Expect is how the job must end: "finish" (the default) or "stop" (a
	// stop the scenario causes on purpose: the launcher's StoppedError).
	Expect string `json:"expect,omitempty"`
	// RecoveryBound is invariant 8's bound: the longest a fault may take
	// from injection to the first step of the rebuilt ring (default 60s).
	RecoveryBound Duration `json:"recovery_bound,omitempty"`
	// CI puts a built-in scenario in the CI set (CISet).
	CI bool `json:"-"`
	// Tolerance is invariant 4's bound when the world or the order of the
	// arithmetic changed: the held-out accuracy within this of the
	// undisturbed run's (default 0.01, one point).
	Tolerance float64 `json:"tolerance,omitempty"`
	// NotApplicable names invariants that have nothing to check in this
	// scenario beyond those its job and faults rule out by themselves (5
	// without checkpoints, 6 outside parameter-server jobs, 8 without a
	// fault that changes the ring, 3 in a parameter-server job without a
	// shard failover). Any other invariant that finds nothing to check
	// fails the run: a fault that silently did nothing must not pass.
	NotApplicable []int `json:"not_applicable,omitempty"`
}

// JobSpec is a job in the terms of the phalanx command's flags.
type JobSpec struct {
	// Kind is "ring" (bulk-synchronous data parallel, the default),
	// "hybrid" (--sync hybrid), "ps" (parameter servers), or another job
	// kind of the runner's registry, the kind of Model (see Unchecked).
	Kind    string            `json:"kind,omitempty"`
	Model   string            `json:"model,omitempty"`   // default mlp
	Options map[string]string `json:"options,omitempty"` // the model's options (mlp: samples, hidden, ...)
	Workers int               `json:"workers"`
	// MinWorkers is the smallest ring that trains (default 1).
	MinWorkers int    `json:"min_workers,omitempty"`
	Steps      int64  `json:"steps"`
	Batch      int    `json:"batch,omitempty"`
	Seed       uint64 `json:"seed,omitempty"`
	// CheckpointEvery: steps between checkpoints (0: none; faults on
	// checkpoints need them).
	CheckpointEvery int64 `json:"checkpoint_every,omitempty"`
	// LeaseTTL: how long a silent worker keeps its place (default the
	// library's).
	LeaseTTL Duration `json:"lease_ttl,omitempty"`
	// Etcd is "embedded" (the launcher's, the default) or "cluster" (three
	// members and Coordinators coordinator processes the harness starts).
	Etcd         string `json:"etcd,omitempty"`
	Coordinators int    `json:"coordinators,omitempty"`
	// Store is "dir" (a directory, the default) or "minio" (a MinIO server
	// the harness starts).
	Store StoreKind `json:"store,omitempty"`
	// Network is "loopback" (the default) or "netns": each worker in a
	// network namespace of its own (root only).
	Network string `json:"network,omitempty"`
	// Pipeline shapes a job of kind pipeline: Workers must be its
	// Replicas × Stages.
	Pipeline *PipelineSpec `json:"pipeline,omitempty"`
}

// PipelineSpec is a pipeline job's shape (phalanx.PipelineConfig):
// replicas, stages, micro-batches per step, schedule, the steps between
// a stage's commits in its neighbour's memory, and tensor-parallel ranks.
type PipelineSpec struct {
	Stages       int    `json:"stages"`
	Replicas     int    `json:"replicas,omitempty"`
	MicroBatches int    `json:"micro_batches,omitempty"`
	Schedule     string `json:"schedule,omitempty"`
	CommitEvery  int    `json:"commit_every,omitempty"`
	// Tensor: tensor-parallel ranks a replica (a model that Splits, as
	// gpt; Stages stays 1 and Workers is Replicas × Tensor).
	Tensor int `json:"tensor,omitempty"`
}

// has says whether the job runs beside the named service.
func (j JobSpec) has(service string) bool {
	switch service {
	case "etcd":
		return j.Etcd == "cluster"
	case "minio":
		return j.Store == "minio"
	case "netns":
		return j.Network == "netns"
	case "ps":
		return j.Kind == "ps"
	}
	return false
}

// FaultSpec is one fault of a schedule.
type FaultSpec struct {
	// Kind names the fault (see Kinds).
	Kind    string  `json:"kind"`
	Trigger Trigger `json:"trigger"`
	// Target is "rank:N", "random" (a random rank of the ring at the
	// trigger), "uploader" (the worker whose upload fired an "upload"
	// trigger), or empty for faults that pick their own (checkpoints, every
	// port).
	Target string `json:"target,omitempty"`
	// Duration: how long a fault with a heal lasts (SIGSTOP until SIGCONT).
	Duration Duration `json:"duration,omitempty"`
	// World: for kill-all, how many workers the resumed job has.
	World int `json:"world,omitempty"`
}

// Trigger says when a fault is injected: at a step (or a random step in
// [Step, StepMax]), After the first step, or On an event:
//   - "launch": as the job is launched, while its workers start and
//     register;
//   - "upload": during a checkpoint upload to MinIO (job.store minio), the
//     first one at or after Step. The worker's request is held at the
//     harness's upload gate until the fault is in, so it lands mid-upload.
type Trigger struct {
	Step    int64    `json:"step,omitempty"`
	StepMax int64    `json:"step_max,omitempty"`
	After   Duration `json:"after,omitempty"`
	On      string   `json:"on,omitempty"`
}

// Duration is a time.Duration written as "1.5s" in JSON and YAML.
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string ("90s", "1m30s").
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"1.5s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Planned is a fault with every random choice of its spec made.
type Planned struct {
	Index int    `json:"index"`
	Kind  string `json:"kind"`
	// Step is the step after which it is injected (0: After the first).
	Step  int64    `json:"step,omitempty"`
	After Duration `json:"after,omitempty"`
	// On is the trigger's event ("launch", "upload"), if any.
	On string `json:"on,omitempty"`
	// Uploader: the target is the worker whose upload fired the trigger.
	Uploader bool `json:"uploader,omitempty"`
	// Rank is the target rank (-1: none; RandomRank picks from the ring at
	// the trigger with Pick, which also seeds the fault's other choices).
	Rank       int      `json:"rank"`
	RandomRank bool     `json:"random_rank,omitempty"`
	Pick       uint64   `json:"pick"`
	Duration   Duration `json:"duration,omitempty"`
	World      int      `json:"world,omitempty"`
}

// Plan resolves the scenario's random choices with seed: the same scenario
// and seed give the same schedule.
func (s *Scenario) Plan(seed uint64) []Planned {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	out := make([]Planned, 0, len(s.Faults))
	for i, f := range s.Faults {
		p := Planned{Index: i, Kind: f.Kind, Step: f.Trigger.Step, After: f.Trigger.After, On: f.Trigger.On, Rank: -1,
			Duration: f.Duration, World: f.World}
		if f.Trigger.StepMax > f.Trigger.Step {
			p.Step = f.Trigger.Step + rng.Int64N(f.Trigger.StepMax-f.Trigger.Step+1)
		}
		p.Pick = rng.Uint64()
		switch {
		case f.Target == "random":
			p.RandomRank = true
		case f.Target == "uploader":
			p.Uploader = true
		case strings.HasPrefix(f.Target, "rank:"):
			fmt.Sscanf(f.Target, "rank:%d", &p.Rank)
		}
		out = append(out, p)
	}
	return out
}

// ErrScenario is wrapped by every error about a scenario's text.
var ErrScenario = errors.New("chaos: bad scenario")

// Validate checks the scenario against the fault kinds it may use.
func (s *Scenario) Validate(kinds Kinds) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrScenario, s.Name, fmt.Sprintf(format, a...))
	}
	switch {
	case s.Name == "":
		return fmt.Errorf("%w: it has no name", ErrScenario)
	case s.Job.Workers < 1 || s.Job.Workers > 64:
		return bad("job.workers %d: want 1..64", s.Job.Workers)
	case s.Job.Steps < 1:
		return bad("job.steps %d: want at least 1", s.Job.Steps)
	case s.Job.Kind != "" && !kindName(s.Job.Kind):
		return bad("job.kind %q: want ring, hybrid, ps or the name of a job kind in the runner's registry", s.Job.Kind)
	case s.Job.Etcd != "" && s.Job.Etcd != "embedded" && s.Job.Etcd != "cluster":
		return bad("job.etcd %q: want embedded or cluster", s.Job.Etcd)
	case s.Job.Store != "" && s.Job.Store != "dir" && s.Job.Store != "minio":
		return bad("job.store %q: want dir or minio", s.Job.Store)
	case s.Job.Network != "" && s.Job.Network != "loopback" && s.Job.Network != "netns":
		return bad("job.network %q: want loopback or netns", s.Job.Network)
	case s.Expect != "" && s.Expect != "finish" && s.Expect != "stop":
		return bad("expect %q: want finish or stop", s.Expect)
	case s.Tolerance < 0 || s.Tolerance >= 1:
		return bad("tolerance %v: want 0 (default) or in (0, 1)", s.Tolerance)
	}
	for _, n := range s.NotApplicable {
		if n < 0 || n > 8 {
			return bad("not_applicable names invariant %d: want 0..8", n)
		}
		if n <= 2 || n == 7 {
			return bad("not_applicable names invariant %d (%s): it applies to every job", n, invariantNames[n])
		}
	}
	for i, f := range s.Faults {
		k, ok := kinds[f.Kind]
		if !ok {
			return bad("fault %d: unknown kind %q (known: %s)", i, f.Kind, strings.Join(kinds.Names(), ", "))
		}
		switch {
		case f.Trigger.Step < 0 || f.Trigger.StepMax < 0:
			return bad("fault %d (%s): negative trigger step", i, f.Kind)
		case f.Trigger.On != "" && f.Trigger.On != "launch" && f.Trigger.On != "upload" && f.Trigger.On != "checkpoint":
			return bad("fault %d (%s): trigger on %q: want launch, upload or checkpoint", i, f.Kind, f.Trigger.On)
		case f.Trigger.On == "checkpoint" && (f.Trigger.After != 0 || f.Trigger.StepMax != 0 || s.Job.CheckpointEvery == 0):
			return bad("fault %d (%s): a trigger on checkpoint takes a step at most (the first at or after it once a checkpoint is saved), and needs checkpoints (job.checkpoint_every)", i, f.Kind)
		case f.Trigger.On == "launch" && (f.Trigger.Step != 0 || f.Trigger.StepMax != 0 || f.Trigger.After != 0):
			return bad("fault %d (%s): a trigger on launch takes no step or after", i, f.Kind)
		case f.Trigger.On == "launch" && (f.Target == "random" || strings.HasPrefix(f.Target, "rank:")):
			return bad("fault %d (%s): at launch there is no ring yet to pick a rank from", i, f.Kind)
		case f.Trigger.On == "upload" && (f.Trigger.After != 0 || f.Trigger.StepMax != 0):
			return bad("fault %d (%s): a trigger on upload takes a step at most (the first upload at or after it)", i, f.Kind)
		case f.Trigger.On == "upload" && !s.Job.has("minio"):
			return bad("fault %d (%s): a trigger on upload needs checkpoints in MinIO (job.store: minio, job.checkpoint_every)", i, f.Kind)
		case f.Trigger.On == "upload" && s.Job.Network == "netns":
			return bad("fault %d (%s): a trigger on upload needs job.network loopback (the upload gate listens on loopback)", i, f.Kind)
		case f.Trigger.On == "upload" && s.Job.CheckpointEvery == 0:
			return bad("fault %d (%s): a trigger on upload needs checkpoints (job.checkpoint_every)", i, f.Kind)
		case f.Target == "uploader" && f.Trigger.On != "upload":
			return bad("fault %d (%s): target uploader needs a trigger on upload", i, f.Kind)
		case f.Trigger.On == "" && f.Trigger.Step == 0 && f.Trigger.After == 0:
			return bad("fault %d (%s): its trigger needs a step, an after or an on", i, f.Kind)
		case f.Trigger.Step >= s.Job.Steps || f.Trigger.StepMax >= s.Job.Steps:
			return bad("fault %d (%s): trigger step %d is not before the job's last step %d", i, f.Kind, max(f.Trigger.Step, f.Trigger.StepMax), s.Job.Steps)
		case f.Target != "" && f.Target != "random" && f.Target != "uploader" && !strings.HasPrefix(f.Target, "rank:"):
			return bad("fault %d (%s): target %q: want rank:N, random or uploader", i, f.Kind, f.Target)
		case k.NeedsRank && f.Target == "":
			return bad("fault %d (%s): it needs a target (rank:N, random or uploader)", i, f.Kind)
		case k.Needs != "" && !s.Job.has(k.Needs):
			return bad("fault %d (%s): it needs the job's %s (job.%s)", i, f.Kind, k.Needs, map[string]string{"etcd": "etcd: cluster", "minio": "store: minio", "netns": "network: netns", "ps": "kind: ps"}[k.Needs])
		case k.NeedsCheckpoints && s.Job.CheckpointEvery == 0:
			return bad("fault %d (%s): the job takes no checkpoints (job.checkpoint_every)", i, f.Kind)
		case (f.Kind == "sigstop" || f.Kind == "ps-ack-lost" || f.Kind == "coordinator-leader-pause") && f.Duration <= 0:
			return bad("fault %d (%s): it needs a duration before SIGCONT", i, f.Kind)
		}
		if strings.HasPrefix(f.Target, "rank:") {
			var r int
			if _, err := fmt.Sscanf(f.Target, "rank:%d", &r); err != nil || r < 0 || r >= s.Job.Workers {
				return bad("fault %d (%s): target %q: want a rank below %d", i, f.Kind, f.Target, s.Job.Workers)
			}
		}
		if f.Kind == "kill-all" && (f.World < 0 || f.World > 64) {
			return bad("fault %d (kill-all): world %d: want 0 (the same) or 1..64", i, f.World)
		}
	}
	return nil
}

// LoadScenario reads a scenario from a JSON or YAML file (by its
// extension: .json, or .yaml/.yml). An error names the file, and the line
// where it can be told (a YAML syntax error names its own).
func LoadScenario(path string) (Scenario, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Scenario{}, fmt.Errorf("chaos: reading scenario: %w", err)
	}
	src := raw
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		if raw, err = yaml.YAMLToJSON(raw); err != nil {
			return Scenario{}, fmt.Errorf("%w %s: %v", ErrScenario, path, err)
		}
	case ".json":
	default:
		return Scenario{}, fmt.Errorf("%w %s: want a .json, .yaml or .yml file", ErrScenario, path)
	}
	var s Scenario
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		if line := lineOf(src, raw, err); line > 0 {
			return Scenario{}, fmt.Errorf("%w %s:%d: %v", ErrScenario, path, line, err)
		}
		return Scenario{}, fmt.Errorf("%w %s: %v", ErrScenario, path, err)
	}
	if s.Name == "" {
		s.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	return s, nil
}

// quoted is the first double-quoted word of an error message.
var quoted = regexp.MustCompile(`"([^"]+)"`)

// lineOf is the line of src (the file as written) that err, from decoding
// its JSON form js, is about, or 0: where the offset says for a JSON file;
// else the first line with the unknown or mistyped key, or the value the
// error quotes.
func lineOf(src, js []byte, err error) int {
	if bytes.Equal(src, js) {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return 1 + bytes.Count(src[:min(int(se.Offset), len(src))], []byte("\n"))
		case errors.As(err, &te):
			return 1 + bytes.Count(src[:min(int(te.Offset), len(src))], []byte("\n"))
		}
	}
	var key, value string
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		key = te.Field[strings.LastIndex(te.Field, ".")+1:]
	} else if m := quoted.FindStringSubmatch(err.Error()); m != nil {
		if strings.Contains(err.Error(), "unknown field") {
			key = m[1]
		} else {
			value = m[1]
		}
	}
	for i, l := range strings.Split(string(src), "\n") {
		t := strings.TrimLeft(strings.TrimSpace(l), "-{ ")
		switch {
		case key != "" && (strings.HasPrefix(t, key+":") || strings.Contains(l, `"`+key+`":`) || strings.Contains(l, " "+key+":") || strings.Contains(l, "{"+key+":")):
			return i + 1
		case value != "" && strings.Contains(l, value):
			return i + 1
		}
	}
	return 0
}

// StoreKind is where a scenario's job keeps its checkpoints (JobSpec.Store).
type StoreKind string

// The stores.
const (
	StoreDir   StoreKind = "dir"
	StoreMinIO StoreKind = "minio"
)

// kindName: a job kind's name is lower-case letters, digits and dashes.
func kindName(k string) bool {
	for _, c := range k {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return k != ""
}

// builtinKind: the kinds the harness knows (ring and hybrid are the ring
// kind's modes).
func builtinKind(k string) bool { return k == "" || k == "ring" || k == "hybrid" || k == "ps" }

// CheckpointVerifier is what a job kind whose checkpoints are its own
// (a pipeline's parts and indexes) may tell the harness: it verifies every
// one in store and says how many it verified, or what does not verify
// (invariant 5).
type CheckpointVerifier interface {
	VerifyCheckpoints(ctx context.Context, store checkpoint.Store) (int, error)
}

// Unchecked is what a job kind other than the ring and the parameter-server
// job may tell the harness: the invariants its jobs' events leave nothing
// to check, and why (a kind that trains no parameters has no samples to
// account for, 2, no parameters to compare, 3 and 4). Every other invariant
// applies to it as to any job.
type Unchecked interface {
	Unchecked() map[int]string
}
