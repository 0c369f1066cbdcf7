package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/failure"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/nn"
)

// trainFlags are the training flags: the launcher passes them to every
// worker, and workers must agree on them (their hash is the job's
// configuration).
type trainFlags struct {
	example     string
	steps       int64
	batch       int
	opt         nn.OptimizerConfig
	sched       nn.Schedule
	clip        float64
	micro       int
	localSteps  int
	commitEvery int
	bucket      int
	seed        uint64
	hidden      []int
	samples     int
	dataDir     string
	timeout     time.Duration
	rescale     string
	refWorld    int
	failWorker  int
	failStep    int64
	failTimes   int
	budget      actors.Budget
	ckpt        checkpointFlags
	inject      failure.Injection
	sync        syncFlags

	bucketText, hiddenText, failAt string
}

// syncFlags choose bulk-synchronous or hybrid-synchronous steps.
type syncFlags struct {
	mode, deadlineText, stale, excludeText string
	factor, quorum, staleDecay             float64
	readmitAfter                           int
	policy                                 hybrid.Policy // derived, for --sync hybrid
}

func (s *syncFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.mode, "sync", "bsp", "bsp: every step waits for every worker; hybrid: a step closes when all are ready or at\n"+
		"its deadline with a --quorum, without the late workers (their gradients are stale)")
	fs.StringVar(&s.deadlineText, "step-deadline", "auto", "hybrid: the step deadline, a duration, or auto: --deadline-factor × the median of recent steps")
	fs.Float64Var(&s.factor, "deadline-factor", 2, "hybrid: the multiple of the median step time an auto deadline is")
	fs.Float64Var(&s.quorum, "quorum", 0.75, "hybrid: the fraction of the workers needed to close a step at its deadline")
	fs.StringVar(&s.stale, "stale", "drop", "hybrid: what a late worker does with its gradients: drop, or decay (added, scaled by\n--stale-decay, to its next step's)")
	fs.Float64Var(&s.staleDecay, "stale-decay", 0.5, "hybrid: the factor of --stale decay")
	fs.StringVar(&s.excludeText, "exclude-after", "5/10", "hybrid: exclude a worker late in X of its last W steps (X/W; 0/0: never)")
	fs.IntVar(&s.readmitAfter, "readmit-after", 5, "hybrid: readmit an excluded worker once its own steps would have met the deadline this many times in a row")
}

func (s *syncFlags) check() error {
	switch s.mode {
	case "bsp":
		return nil
	case "hybrid":
	default:
		return usagef("--sync %q: want bsp or hybrid (async arrives with the parameter server)", s.mode)
	}
	p := hybrid.Policy{AutoFactor: s.factor, Quorum: s.quorum, ReadmitAfter: s.readmitAfter, MinWorkers: 1}
	if s.deadlineText == "auto" {
		p.Auto, p.Deadline = true, 2*time.Second // until the first steps are timed
	} else {
		d, err := time.ParseDuration(s.deadlineText)
		if err != nil || d <= 0 {
			return usagef("--step-deadline %q: want auto or a positive duration such as 200ms", s.deadlineText)
		}
		p.Deadline = d
	}
	if s.excludeText != "0/0" {
		x, w, err := hybrid.ParseExcludeAfter(s.excludeText)
		if err != nil {
			return usagef("--exclude-after: %v", err)
		}
		p.ExcludeAfter, p.Window = x, w
	}
	switch {
	case s.stale != "drop" && s.stale != "decay":
		return usagef("--stale %q: want drop or decay", s.stale)
	case s.stale == "decay" && !(s.staleDecay > 0 && s.staleDecay <= 1):
		return usagef("--stale-decay %v: want a factor in (0, 1]", s.staleDecay)
	}
	if err := p.Validate(); err != nil {
		return usagef("--sync hybrid: %v", err)
	}
	s.policy = p
	return nil
}

// checkpointFlags say where and how often the job checkpoints.
type checkpointFlags struct {
	url        string
	everySteps int64
	every      time.Duration
	keepLast   int
	keepEvery  int
	wait       time.Duration
	resume     bool
}

func (k *checkpointFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.url, "checkpoint", "", "where checkpoints go: a directory, or s3://bucket/prefix?endpoint=host:port[&region=R][&tls=true|false]\n"+
		"(S3 credentials from --s3-access-key/--s3-secret-key or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY;\n"+
		"TLS is off by default for a loopback endpoint). A job whose store holds checkpoints resumes from the newest that verifies")
	fs.Int64Var(&k.everySteps, "checkpoint-every-steps", 0, "checkpoint every this many steps (0: not by steps; with neither period, only at the end and on SIGTERM)")
	fs.DurationVar(&k.every, "checkpoint-every", 0, "checkpoint this often (0: not by time)")
	fs.IntVar(&k.keepLast, "checkpoint-keep", 3, "keep the newest this many checkpoints (0: keep all)")
	fs.IntVar(&k.keepEvery, "checkpoint-keep-every", 0, "also keep every this-many-th checkpoint (by sequence number; 0: none)")
	fs.DurationVar(&k.wait, "checkpoint-wait", 2*time.Minute, "back-pressure bound: how long training waits for the previous upload when the next checkpoint\n"+
		"is due (and for the final one) before it gives that checkpoint up as failed")
	fs.BoolVar(&k.resume, "resume", false, "require a checkpoint to resume from (without it, resuming is automatic when the store has one)")
}

func (k *checkpointFlags) check() error {
	switch {
	case k.url == "" && (k.everySteps != 0 || k.every != 0 || k.resume):
		return usagef("--checkpoint-every-steps, --checkpoint-every and --resume need --checkpoint")
	case k.everySteps < 0 || k.every < 0:
		return usagef("--checkpoint-every-steps and --checkpoint-every must not be negative")
	case k.keepLast < 0 || k.keepEvery < 0:
		return usagef("--checkpoint-keep and --checkpoint-keep-every must not be negative")
	case k.wait <= 0:
		return usagef("--checkpoint-wait %v: must be positive", k.wait)
	}
	if k.url != "" {
		if _, err := checkpoint.ParseLocation(k.url); err != nil {
			return usagef("--checkpoint: %v", err)
		}
	}
	return nil
}

// injectFlag collects --inject-slow or --inject-pause specs. Its String is
// the specs joined by ';', which Set reads back, so the launcher can pass
// the flag on to its workers as one argument.
type injectFlag struct {
	in   *failure.Injection
	slow bool
	text []string
}

func (f *injectFlag) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.text, ";")
}

func (f *injectFlag) Set(s string) error {
	for _, spec := range strings.Split(s, ";") {
		if spec = strings.TrimSpace(spec); spec == "" {
			continue
		}
		if f.slow {
			v, err := failure.ParseSlow(spec)
			if err != nil {
				return err
			}
			f.in.Slow = append(f.in.Slow, v)
		} else {
			v, err := failure.ParsePause(spec)
			if err != nil {
				return err
			}
			f.in.Pause = append(f.in.Pause, v)
		}
		f.text = append(f.text, spec)
	}
	return nil
}

// isFaultFlag: fault injection, which workers need not share.
func isFaultFlag(name string) bool {
	return strings.HasPrefix(name, "fail-") || strings.HasPrefix(name, "inject-")
}

// isCheckpointFlag: flags that say how the job checkpoints, not what the
// state means.
func isCheckpointFlag(name string) bool {
	return strings.HasPrefix(name, "checkpoint") || name == "resume"
}

// stateFlags give a checkpoint's state its meaning: a resume needs the same.
var stateFlags = []string{"example", "hidden", "optimizer", "nesterov", "seed", "samples", "data"}

// s3Flags are explicit S3 credentials. They never travel on a command line
// to the workers (nor into logs): the workers get them in the environment.
type s3Flags struct {
	accessKey, secretKey string
}

func (s *s3Flags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.accessKey, "s3-access-key", "", "S3 access key for --checkpoint (default: AWS_ACCESS_KEY_ID, MINIO_ROOT_USER, ~/.aws/credentials)")
	fs.StringVar(&s.secretKey, "s3-secret-key", "", "S3 secret key for --checkpoint (default: AWS_SECRET_ACCESS_KEY, ...); prefer the environment,\nwhich other users of the host cannot read from the process list")
}

func (s *s3Flags) credentials() checkpoint.Credentials {
	return checkpoint.Credentials{AccessKey: s.accessKey, SecretKey: s.secretKey}
}

func (s *s3Flags) env() []string {
	if s.accessKey == "" && s.secretKey == "" {
		return nil
	}
	return []string{"AWS_ACCESS_KEY_ID=" + s.accessKey, "AWS_SECRET_ACCESS_KEY=" + s.secretKey}
}

// membershipFlags say where the job's membership lives.
type membershipFlags struct {
	endpoints   string
	job         string
	leaseTTL    time.Duration
	unreachable time.Duration
}

func (m *membershipFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&m.endpoints, "etcd-endpoints", "", "comma-separated endpoints of an external etcd cluster (default: an embedded etcd server)")
	fs.StringVar(&m.job, "job", "", "the job's name: its keys in etcd live under /phalanx/<job>/")
	fs.DurationVar(&m.leaseTTL, "lease-ttl", 5*time.Second, "a worker's registration lease: a frozen or partitioned worker is removed this long after its last keep-alive")
	fs.DurationVar(&m.unreachable, "unreachable", time.Minute, "how long a worker trains on without etcd, or waits for a decision after its ring broke, before it fails")
}

func (m *membershipFlags) check() error {
	switch {
	case m.leaseTTL < time.Second:
		return usagef("--lease-ttl %v: want at least 1s (etcd leases count whole seconds)", m.leaseTTL)
	case m.unreachable <= 0:
		return usagef("--unreachable %v: must be positive", m.unreachable)
	case m.job != "" && strings.ContainsAny(m.job, "/\x00"):
		return usagef("--job %q: want a name without '/'", m.job)
	}
	return nil
}

func (m *membershipFlags) endpointList() []string {
	var out []string
	for _, e := range strings.Split(m.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// register defines the training flags on fs.
func (c *trainFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.example, "example", "mlp", "example to train: mlp (data-parallel over a ring), or sparse-lr (logistic regression on\na synthetic click log over parameter servers: see the --ps-* flags)")
	fs.Int64Var(&c.steps, "steps", 300, "the job's total number of steps")
	fs.IntVar(&c.batch, "batch", 256, "global batch: samples per step across all workers")
	fs.StringVar(&c.opt.Kind, "optimizer", "momentum", "optimizer: sgd, momentum, adam or adamw")
	fs.Float64Var(&c.sched.Base, "lr", 0.05, "base learning rate")
	fs.Float64Var(&c.opt.Momentum, "momentum", 0.9, "momentum factor (optimizer momentum)")
	fs.BoolVar(&c.opt.Nesterov, "nesterov", false, "Nesterov momentum")
	fs.Float64Var(&c.opt.WeightDecay, "weight-decay", 0, "weight decay (L2; decoupled for adamw)")
	fs.StringVar(&c.sched.Kind, "schedule", "cosine", "learning-rate schedule after warm-up: constant, step or cosine (to 0 at --steps)")
	fs.Int64Var(&c.sched.Warmup, "warmup", 10, "linear warm-up steps")
	fs.Int64Var(&c.sched.Every, "decay-every", 100, "step schedule: decay period in steps")
	fs.Float64Var(&c.sched.Gamma, "decay-factor", 0.1, "step schedule: factor applied every --decay-every steps")
	fs.Float64Var(&c.clip, "clip", 0, "clip gradients to this global L2 norm (0: off)")
	fs.IntVar(&c.micro, "micro-batches", 1, "gradient accumulation: micro-batches per worker per step, one allreduce per step")
	fs.IntVar(&c.localSteps, "local-steps", 1, "1: average gradients every step; K > 1: local SGD, average parameters every K steps")
	fs.IntVar(&c.commitEvery, "commit-every", 1, "commit the training state in memory every this many steps (a membership change\nredoes the steps since the last commit)")
	fs.StringVar(&c.bucketText, "bucket", "1MiB", "gradient fusion bucket size")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the weights, the synthetic data and the shuffle")
	fs.StringVar(&c.hiddenText, "hidden", "512,512", "mlp: comma-separated hidden layer widths")
	fs.IntVar(&c.samples, "samples", 60000, "mlp: synthetic training samples (a further 10000 are held out)")
	fs.StringVar(&c.dataDir, "data", "", "mlp: directory with MNIST's IDX files instead of the synthetic task")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "deadline of every collective operation")
	fs.StringVar(&c.rescale, "rescale", "batch", "when the world size changes: batch keeps the global batch and rescales each worker's\nshare; lr keeps each worker's share (--batch / --reference-world) and scales the learning rate")
	fs.IntVar(&c.refWorld, "reference-world", 0, "with --rescale lr: the world size --batch and --lr are meant for (default: --workers)")
	fs.StringVar(&c.failAt, "fail-at", "", "fault injection: WORKER:STEP makes that worker's model code panic once at that step;\nits supervisor restarts the rank actor, which resumes from its commit")
	fs.IntVar(&c.failTimes, "fail-times", 1, "fault injection: how many times in a row --fail-at fails")
	fs.Var(&injectFlag{in: &c.inject, slow: true}, "inject-slow", "fault injection: rank=R,factor=F[,from=S,to=T] makes the model code of ring rank R F times slower\nin steps S..T (T absent: to the end); repeat the flag, or separate specs with ';'")
	fs.Var(&injectFlag{in: &c.inject}, "inject-pause", "fault injection: rank=R,at=S,for=D pauses ring rank R for D before step S; repeatable like --inject-slow")
	c.budget = actors.DefaultBudget()
	fs.IntVar(&c.budget.MaxRestarts, "max-restarts", c.budget.MaxRestarts, "restart budget: a rank actor failing more often than this within --restart-window ends the worker")
	fs.DurationVar(&c.budget.Window, "restart-window", c.budget.Window, "restart budget window")
	c.ckpt.register(fs)
	c.sync.register(fs)
}

// isTrainingFlag reports whether name is one of the training flags.
func isTrainingFlag(name string) bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	(&trainFlags{}).register(fs)
	return fs.Lookup(name) != nil
}

// check validates the parsed training flags and fills the derived fields.
func (c *trainFlags) check() error {
	var err error
	c.failWorker = -1
	if c.failAt != "" {
		r, st, ok := strings.Cut(c.failAt, ":")
		w, err1 := strconv.Atoi(r)
		step, err2 := strconv.ParseInt(st, 10, 64)
		if !ok || err1 != nil || err2 != nil || w < 0 || step < 1 {
			return usagef("--fail-at %q: want WORKER:STEP with a worker index from 0 and a step from 1", c.failAt)
		}
		c.failWorker, c.failStep = w, step
	}
	switch {
	case c.budget.MaxRestarts < 0 || c.budget.Window <= 0:
		return usagef("--max-restarts must not be negative and --restart-window must be positive")
	case c.example != "mlp":
		return usagef("--example %q: the examples are: mlp, sparse-lr", c.example)
	case c.steps < 1:
		return usagef("--steps %d: want at least 1", c.steps)
	case c.batch < 1:
		return usagef("--batch %d: want at least 1", c.batch)
	case c.micro < 1 || c.localSteps < 1 || c.commitEvery < 1:
		return usagef("--micro-batches, --local-steps and --commit-every must be at least 1")
	case c.samples < 1:
		return usagef("--samples %d: want at least 1", c.samples)
	case c.timeout <= 0:
		return usagef("--timeout %v: must be positive", c.timeout)
	case c.rescale != "batch" && c.rescale != "lr":
		return usagef("--rescale %q: want batch or lr", c.rescale)
	case c.refWorld < 0 || (c.rescale == "lr" && c.refWorld > c.batch):
		return usagef("--reference-world %d: want 1..--batch", c.refWorld)
	}
	if err := c.ckpt.check(); err != nil {
		return err
	}
	if err := c.sync.check(); err != nil {
		return err
	}
	if c.bucket, err = parseSize(c.bucketText); err != nil || c.bucket < 1 {
		return usagef("--bucket %q: want a size such as 1MiB", c.bucketText)
	}
	if c.hidden, err = parseWidths(c.hiddenText); err != nil {
		return usagef("--hidden: %v", err)
	}
	if c.sched.Kind == "cosine" {
		c.sched.Total = max(c.steps, c.sched.Warmup+1)
	}
	if err := c.sched.Validate(); err != nil {
		return usagef("learning rate: %v", err)
	}
	if _, err := nn.NewOptimizer(c.opt, nil); err != nil {
		return usagef("--optimizer: %v", err)
	}
	return nil
}

// configHash identifies the training configuration that the workers of a job
// must share: every training flag's value except the fault injection.
func configHash(fs *flag.FlagSet) string {
	return flagHash(fs, func(name string) bool { return isTrainingFlag(name) && !isFaultFlag(name) })
}

// checkpointHashes are the hashes a checkpoint records: of every training
// flag but those about checkpoints and fault injection (a difference is
// worth a warning), and of the flags that give the state its meaning (a
// difference refuses the resume).
func checkpointHashes(fs *flag.FlagSet) (config, state string) {
	config = flagHash(fs, func(name string) bool {
		return isTrainingFlag(name) && !isFaultFlag(name) && !isCheckpointFlag(name)
	})
	state = flagHash(fs, func(name string) bool { return slices.Contains(stateFlags, name) })
	return config, state
}

func flagHash(fs *flag.FlagSet, include func(string) bool) string {
	var kv []string
	fs.VisitAll(func(f *flag.Flag) {
		if include(f.Name) {
			kv = append(kv, f.Name+"="+f.Value.String())
		}
	})
	sort.Strings(kv)
	sum := sha256.Sum256([]byte(strings.Join(kv, "\n")))
	return hex.EncodeToString(sum[:6])
}

// passThrough is the command line that gives a worker the flags set on fs
// that are training or membership flags.
func passThrough(fs *flag.FlagSet, also func(string) bool) []string {
	var out []string
	fs.Visit(func(f *flag.Flag) {
		if isTrainingFlag(f.Name) || also(f.Name) {
			out = append(out, fmt.Sprintf("--%s=%s", f.Name, f.Value.String()))
		}
	})
	return out
}

func parseWidths(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || w < 1 {
			return nil, fmt.Errorf("width %q: want a positive integer", f)
		}
		out = append(out, w)
	}
	return out, nil
}
