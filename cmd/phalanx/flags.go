package main

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/failure"
	"github.com/phalanx-rt/phalanx/hybrid"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
)

// configFlags define the flags of a phalanx.Config: the training flags
// every worker of a job shares, and the membership flags. Flags whose
// value needs parsing are read into text fields and converted by apply.
type configFlags struct {
	cfg                                    phalanx.Config
	bucket, deadline, excludeAfter, failAt string
	maxMemory                              string
	ppCuts                                 string
	etcd                                   string
	options                                map[string]string // model options set on the command line
	registry                               *phalanx.Registry
	s3                                     s3Flags
}

// register defines the flags on fs, with models' options from reg.
func (f *configFlags) register(fs *pflag.FlagSet, reg *phalanx.Registry) {
	f.cfg = phalanx.DefaultConfig()
	f.registry = reg
	c := &f.cfg
	fs.StringVar(&c.Model, "example", "mlp", "the model to train: "+strings.Join(reg.Names(), ", "))
	fs.Int64Var(&c.Steps, "steps", c.Steps, "the job's total number of steps (resuming with more trains longer)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "global batch: samples per step across all workers")
	fs.StringVar(&c.Optimizer.Kind, "optimizer", c.Optimizer.Kind, "optimizer: sgd, momentum, adam or adamw")
	fs.Float64Var(&c.Schedule.Base, "lr", c.Schedule.Base, "base learning rate")
	fs.Float64Var(&c.Optimizer.Momentum, "momentum", c.Optimizer.Momentum, "momentum factor (optimizer momentum)")
	fs.BoolVar(&c.Optimizer.Nesterov, "nesterov", false, "Nesterov momentum")
	fs.Float64Var(&c.Optimizer.WeightDecay, "weight-decay", 0, "weight decay (L2; decoupled for adamw)")
	fs.StringVar(&c.Schedule.Kind, "schedule", c.Schedule.Kind, "learning-rate schedule after warm-up: constant, step or cosine (to 0 at --steps)")
	fs.Int64Var(&c.Schedule.Warmup, "warmup", c.Schedule.Warmup, "linear warm-up steps")
	fs.Int64Var(&c.Schedule.Every, "decay-every", c.Schedule.Every, "step schedule: decay period in steps")
	fs.Float64Var(&c.Schedule.Gamma, "decay-factor", c.Schedule.Gamma, "step schedule: factor applied every --decay-every steps")
	fs.Float64Var(&c.ClipNorm, "clip", 0, "clip gradients to this global L2 norm (0: off)")
	fs.IntVar(&c.MicroBatches, "micro-batches", c.MicroBatches, "gradient accumulation: micro-batches per worker per step, one allreduce per step")
	fs.IntVar(&c.LocalSteps, "local-steps", c.LocalSteps, "1: average gradients every step; K > 1: local SGD, average parameters every K steps")
	fs.IntVar(&c.CommitEvery, "commit-every", c.CommitEvery, "commit the training state in memory every this many steps (a membership change\nredoes the steps since the last commit)")
	fs.StringVar(&f.bucket, "bucket", "1MiB", "gradient fusion bucket size")
	fs.StringVar(&f.maxMemory, "max-memory", "0", "a worker's budget for its training state (parameters, gradients, optimizer slots), such as\n512MiB: a model that needs more is refused before any worker starts (0: none)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the weights, the data and the shuffle")
	fs.DurationVar(&c.OpTimeout, "timeout", c.OpTimeout, "deadline of every collective operation")
	fs.StringVar((*string)(&c.Transport), "transport", string(c.Transport), "data plane between ranks: auto (shared memory between ranks on one host, TCP between hosts,\nhierarchical allreduce when every host has several ranks), tcp, or shm (every rank on one host)")
	fs.StringVar((*string)(&c.WireDType), "wire-dtype", string(c.WireDType), "type gradients travel in: float32, or fp16 / bf16 (half the bytes, reduced in float32)")
	fs.BoolVar(&c.ErrorFeedback, "error-feedback", false, "with --wire-dtype fp16|bf16: carry each step's rounding residue into the next step's gradient")
	fs.StringVar((*string)(&c.Rescale), "rescale", string(c.Rescale), "when the world size changes: batch keeps the global batch and rescales each worker's\nshare; lr keeps each worker's share (--batch / --reference-world) and scales the learning rate")
	fs.IntVar(&c.ReferenceWorld, "reference-world", 0, "with --rescale lr: the world size --batch and --lr are meant for (default: --workers)")
	fs.StringVar(&f.failAt, "fail-at", "", "fault injection: WORKER:STEP makes that worker's model code panic once at that step;\nits supervisor restarts the rank actor, which resumes from its commit")
	fs.IntVar(&c.Faults.FailTimes, "fail-times", c.Faults.FailTimes, "fault injection: how many times in a row --fail-at fails")
	fs.Var(&injectFlag{in: &c.Faults.Inject, kind: "slow"}, "inject-slow", "fault injection: rank=R,factor=F[,from=S,to=T] makes the model code of ring rank R F times slower\nin steps S..T (T absent: to the end); repeat the flag, or separate specs with ';'")
	fs.Var(&injectFlag{in: &c.Faults.Inject, kind: "pause"}, "inject-pause", "fault injection: rank=R,at=S,for=D pauses ring rank R for D before step S; repeatable like --inject-slow")
	fs.Var(&injectFlag{in: &c.Faults.Inject, kind: "wrong-op"}, "inject-wrong-op", "fault injection: rank=R,at=S makes ring rank R call a barrier the others do not before step S\n(a hang the launcher's hang analysis names); repeatable like --inject-slow")
	fs.IntVar(&c.Restarts.MaxRestarts, "max-restarts", c.Restarts.MaxRestarts, "restart budget: a rank actor failing more often than this within --restart-window ends the worker")
	fs.DurationVar(&c.Restarts.Window, "restart-window", c.Restarts.Window, "restart budget window")

	k := &c.Checkpoint
	fs.StringVar(&k.Location, "checkpoint", "", "where checkpoints go: a directory, or s3://bucket/prefix?endpoint=host:port[&region=R][&tls=true|false]\n"+
		"(S3 credentials from --s3-access-key/--s3-secret-key or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY;\n"+
		"TLS is off by default for a loopback endpoint). A job whose store holds checkpoints resumes from the newest that verifies")
	fs.Int64Var(&k.EverySteps, "checkpoint-every-steps", 0, "checkpoint every this many steps (0: not by steps; with neither period, only at the end and on a stop)")
	fs.DurationVar(&k.Every, "checkpoint-every", 0, "checkpoint this often (0: not by time)")
	fs.IntVar(&k.KeepLast, "checkpoint-keep", k.KeepLast, "keep the newest this many checkpoints (0: keep all)")
	fs.IntVar(&k.KeepEvery, "checkpoint-keep-every", 0, "also keep every this-many-th checkpoint (by sequence number; 0: none)")
	fs.DurationVar(&k.Wait, "checkpoint-wait", k.Wait, "back-pressure bound: how long training waits for the previous upload when the next checkpoint\n"+
		"is due (and for the final one) before it gives that checkpoint up as failed")
	fs.BoolVar(&k.Resume, "resume", false, "require a checkpoint to resume from (without it, resuming is automatic when the store has one)")

	s := &c.Sync
	fs.StringVar((*string)(&s.Mode), "sync", string(s.Mode), "bsp: every step waits for every worker; hybrid: a step closes when all are ready or at\n"+
		"its deadline with a --quorum, without the late workers (their gradients are stale); parameter-server\njobs also take asp (async) and ssp")
	fs.StringVar(&f.deadline, "step-deadline", "auto", "hybrid: the step deadline, a duration, or auto: --deadline-factor × the median of recent steps")
	fs.Float64Var(&s.DeadlineFactor, "deadline-factor", s.DeadlineFactor, "hybrid: the multiple of the median step time an auto deadline is")
	fs.Float64Var(&s.Quorum, "quorum", s.Quorum, "hybrid: the fraction of the workers needed to close a step at its deadline")
	fs.StringVar((*string)(&s.Stale), "stale", string(s.Stale), "hybrid: what a late worker does with its gradients: drop, or decay (added, scaled by\n--stale-decay, to its next step's)")
	fs.Float64Var(&s.StaleDecay, "stale-decay", s.StaleDecay, "hybrid: the factor of --stale decay")
	fs.StringVar(&f.excludeAfter, "exclude-after", "5/10", "hybrid: exclude a worker late in X of its last W steps (X/W; 0/0: never)")
	fs.IntVar(&s.ReadmitAfter, "readmit-after", s.ReadmitAfter, "hybrid: readmit an excluded worker once its own steps would have met the deadline this many times in a row")
	fs.IntVar(&s.Staleness, "staleness", s.Staleness, "parameter servers with --sync ssp: how many clocks a worker may run ahead of the slowest")

	p := &c.PS
	fs.IntVar(&p.Servers, "ps-servers", p.Servers, "parameter-server models: server processes to start")
	fs.IntVar(&p.Shards, "ps-shards", 0, "parameter servers: shards of the parameters (default: --ps-servers)")
	fs.IntVar(&p.Replicas, "ps-replicas", p.Replicas, "parameter servers: backups of each shard (default: 1 with two servers or more)")
	fs.StringVar(&p.Partition, "ps-partition", p.Partition, "parameter servers: how keys split between shards: range or hash (consistent)")
	fs.StringVar(&p.Optimizer, "ps-optimizer", p.Optimizer, "parameter servers: the servers' optimizer: sgd, adagrad or adam")
	fs.Float64Var(&p.LR, "ps-lr", p.LR, "parameter servers: the servers' learning rate")
	fs.IntVar(&p.CacheRows, "ps-cache-rows", 0, "parameter servers: rows each worker caches (hot keys; 0: no cache)")
	fs.Int64Var(&p.CacheStaleness, "ps-cache-staleness", p.CacheStaleness, "parameter servers: clocks a cached row may serve pulls after it was pulled")
	fs.IntVar(&p.ReportEvery, "report-every", 0, "parameter servers: steps between progress reports (default: a twentieth of the job)")

	pl := &c.Pipeline
	fs.IntVar(&pl.Stages, "pp", pl.Stages, "pipeline models (deep-mlp): stages per replica, one worker process each")
	fs.IntVar(&pl.Replicas, "dp", pl.Replicas, "pipeline and tensor-parallel models: replicas of the pipeline (or of the split model); --workers defaults to\n--dp × --pp (or --dp × --tp)")
	fs.IntVar(&pl.Tensor, "tp", 0, "tensor-parallel models (gpt): ranks each replica's model is split across, one worker process each;\n0: not split, a data-parallel ring of --workers (--dp 2 --tp 1 is a data-parallel mesh whose checkpoints\nreshard to any --tp)")
	fs.StringVar(&pl.Schedule, "pp-schedule", pl.Schedule, "pipeline models: micro-batch schedule: gpipe, 1f1b, interleaved or zb-h1 (zero bubble)")
	fs.IntVar(&pl.Chunks, "pp-chunks", 0, "pipeline models, --pp-schedule interleaved: model chunks per stage (default 2)")
	fs.StringVar(&f.ppCuts, "pp-cuts", "", "pipeline models: the first layer of each stage after the first, as indices or layer names\n(\"4,8,12\" or \"fc2,fc4,fc6\"); default: balanced by --pp-balance")
	fs.StringVar(&pl.Balance, "pp-balance", pl.Balance, "pipeline models: how stages are balanced without --pp-cuts: params (parameter count) or time\n(each layer's forward and backward, measured by the launcher)")
	fs.BoolVar(&pl.Recompute, "pp-recompute", false, "pipeline models: keep only each micro-batch's stage input and recompute the forward before\nthe backward (less memory, one more forward)")

	// Every model's options, each once (its usage says what it means to
	// each model that has it): a model refuses options it does not have.
	f.options = map[string]string{}
	var names []string
	usage, defaults := map[string][]string{}, map[string]string{}
	for _, spec := range reg.Specs() {
		for _, o := range spec.Options {
			if usage[o.Name] == nil {
				names = append(names, o.Name)
			}
			usage[o.Name] = append(usage[o.Name], fmt.Sprintf("%s: %s (default %q)", spec.Name, o.Usage, o.Default))
			defaults[o.Name] = o.Default
		}
	}
	for _, name := range names {
		fs.Func(name, strings.Join(usage[name], ";\n"), func(v string) error {
			f.options[name] = v
			return nil
		})
		if defaults[name] == "false" { // a switch: the flag alone means true
			fs.Lookup(name).NoOptDefVal = "true"
		}
	}
	f.registerMembership(fs)
	f.s3.register(fs)
}

// registerMembership defines the flags of where the job's membership lives.
func (f *configFlags) registerMembership(fs *pflag.FlagSet) {
	c := &f.cfg
	fs.StringVar(&f.etcd, "etcd-endpoints", "", "comma-separated endpoints of an external etcd cluster (default: an embedded etcd server)")
	fs.StringVar(&c.Job, "job", "", "the job's name: its keys in etcd live under /phalanx/<job>/")
	fs.DurationVar(&c.EtcdDialTimeout, "etcd-dial-timeout", c.EtcdDialTimeout, "how long to wait for etcd's first answer, saying every 5s what is awaited, before giving up")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "a worker's registration lease: a frozen or partitioned worker is removed this long after its last keep-alive")
	fs.DurationVar(&c.Unreachable, "unreachable", c.Unreachable, "how long a worker trains on without etcd, or waits for a decision after its ring broke, before it fails")
	registerTLS(fs, &c.TLS)
}

// registerTLS defines the flags of a process's mutual TLS files.
func registerTLS(fs *pflag.FlagSet, f *phalanx.TLSFiles) {
	fs.StringVar(&f.CA, "tls-ca", "", "mutual TLS: the job's CA (PEM). With --tls-cert and --tls-key (all three or none) every plane\n"+
		"(the data plane, the parameter servers', the actors', etcd) speaks TLS and refuses plaintext")
	fs.StringVar(&f.Cert, "tls-cert", "", "mutual TLS: this process's certificate (PEM), which names the job (phalanx certs init makes them)")
	fs.StringVar(&f.Key, "tls-key", "", "mutual TLS: this process's private key (PEM)")
}

// apply converts the text flags into the configuration; the library
// validates the rest.
func (f *configFlags) apply() error {
	c := &f.cfg
	c.ModelOptions = f.options
	c.Credentials = f.s3.credentials()
	c.Etcd = endpointList(f.etcd)
	n, err := bytesize.Parse(f.bucket)
	if err != nil || n < 1 {
		return usagef("--bucket %q: want a size such as 1MiB", f.bucket)
	}
	c.BucketBytes = n
	mem, err := bytesize.Parse(f.maxMemory)
	if err != nil || mem < 0 {
		return usagef("--max-memory %q: want a size such as 512MiB, or 0 for none", f.maxMemory)
	}
	c.MaxMemory = int64(mem)
	if f.deadline != "auto" {
		if c.Sync.Deadline, err = time.ParseDuration(f.deadline); err != nil || c.Sync.Deadline <= 0 {
			return usagef("--step-deadline %q: want auto or a positive duration such as 200ms", f.deadline)
		}
	}
	c.Sync.ExcludeAfter, c.Sync.ExcludeWindow = 0, 0
	if f.excludeAfter != "0/0" {
		if c.Sync.ExcludeAfter, c.Sync.ExcludeWindow, err = hybrid.ParseExcludeAfter(f.excludeAfter); err != nil {
			return usagef("--exclude-after: %v", err)
		}
	}
	if f.ppCuts != "" {
		if c.Pipeline.Cuts, err = phalanx.ParsePipelineCuts(f.ppCuts, c.Model, c.ModelOptions, f.registry); err != nil {
			return usagef("--pp-cuts %q: %v", f.ppCuts, err)
		}
	}
	if f.failAt != "" {
		w, st, ok := strings.Cut(f.failAt, ":")
		worker, err1 := strconv.Atoi(w)
		step, err2 := strconv.ParseInt(st, 10, 64)
		if !ok || err1 != nil || err2 != nil || worker < 0 || step < 1 {
			return usagef("--fail-at %q: want WORKER:STEP with a worker index from 0 and a step from 1", f.failAt)
		}
		c.Faults.FailWorker, c.Faults.FailStep = worker, step
	}
	return nil
}

// flagOf names the flag of a configuration field, for errors.
var flagOf = map[string]string{
	"Model": "--example", "ModelOptions": "--example", "Steps": "--steps", "Batch": "--batch", "Schedule": "learning rate (--schedule, --lr, --warmup)",
	"Optimizer.Kind": "--optimizer", "ClipNorm": "--clip", "MicroBatches": "--micro-batches", "LocalSteps": "--local-steps",
	"CommitEvery": "--commit-every", "BucketBytes": "--bucket", "OpTimeout": "--timeout", "Transport": "--transport", "WireDType": "--wire-dtype", "ErrorFeedback": "--error-feedback", "Rescale": "--rescale",
	"ReferenceWorld": "--reference-world", "LeaseTTL": "--lease-ttl", "Unreachable": "--unreachable", "Job": "--job", "Etcd": "--etcd-endpoints", "EtcdDialTimeout": "--etcd-dial-timeout",
	"Restarts.MaxRestarts": "--max-restarts", "Restarts.Window": "--restart-window", "Faults.FailStep": "--fail-at",
	"Faults.FailTimes": "--fail-times", "Faults.FailWorker": "--fail-at",
	"Pipeline.Stages": "--pp", "Pipeline.Replicas": "--dp", "Pipeline.Tensor": "--tp", "MaxMemory": "--max-memory", "Pipeline.Schedule": "--pp-schedule", "Pipeline.Chunks": "--pp-chunks",
	"Pipeline.Cuts": "--pp-cuts", "Pipeline.Balance": "--pp-balance", "Pipeline": "--pp, --micro-batches, --pp-schedule",
	"Checkpoint.Location": "--checkpoint", "Checkpoint.EverySteps": "--checkpoint-every-steps", "Checkpoint.Every": "--checkpoint-every",
	"Checkpoint.KeepLast": "--checkpoint-keep", "Checkpoint.KeepEvery": "--checkpoint-keep-every", "Checkpoint.Wait": "--checkpoint-wait",
	"Sync": "--sync", "Sync.Mode": "--sync", "Sync.Deadline": "--step-deadline", "Sync.ExcludeAfter": "--exclude-after", "Sync.Stale": "--stale",
	"Sync.StaleDecay": "--stale-decay", "PS.Servers": "--ps-servers", "PS.Shards": "--ps-shards", "PS.Replicas": "--ps-replicas",
	"PS": "--ps-partition", "PS.CacheRows": "--ps-cache-rows", "PS.CacheStaleness": "--ps-cache-staleness", "PS.ReportEvery": "--report-every",
	"Workers": "--workers", "MinWorkers": "--min-workers", "MinWorkersTimeout": "--min-workers-timeout", "JoinWindow": "--join-window",
	"Threads": "--threads", "LogLevel": "--log-level", "LogEvery": "--log-every", "MaxWorkers": "--max-workers",
	"Checkpoint.Resume": "--resume", "Metrics": "--metrics", "Status": "--status", "Trace": "--trace",
	"TLS": "--tls-ca, --tls-cert, --tls-key", "TLSAuto": "--tls",
}

// asUsage turns a configuration error into a usage error naming the flag,
// and the flags of the other fields its reason names.
func asUsage(err error) error {
	var ce *phalanx.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	name, ok := flagOf[ce.Field]
	if !ok {
		name = ce.Field
	}
	return usagef("%s %s: %s", name, ce.ValueText(), flagNames(ce.Reason))
}

// fieldRef is a configuration field's name in a sentence: a capitalised
// Go identifier, dotted paths included.
var fieldRef = regexp.MustCompile(`\b[A-Z][A-Za-z]*(\.[A-Z][A-Za-z]*)*\b`)

// flagNames writes the flags in place of the configuration fields that s
// names ("MaxWorkers" becomes "--max-workers").
func flagNames(s string) string {
	return fieldRef.ReplaceAllStringFunc(s, func(f string) string {
		if name, ok := flagOf[f]; ok && strings.HasPrefix(name, "--") {
			return name
		}
		return f
	})
}

// injectFlag collects --inject-slow, --inject-pause or --inject-wrong-op
// specs.
type injectFlag struct {
	in   *failure.Injection
	kind string // slow, pause, wrong-op
	text []string
}

func (f *injectFlag) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.text, ";")
}

// Type is the flag's kind of value, for help and completion.
func (f *injectFlag) Type() string { return "spec" }

func (f *injectFlag) Set(s string) error {
	for _, spec := range strings.Split(s, ";") {
		if spec = strings.TrimSpace(spec); spec == "" {
			continue
		}
		switch f.kind {
		case "slow":
			v, err := failure.ParseSlow(spec)
			if err != nil {
				return err
			}
			f.in.Slow = append(f.in.Slow, v)
		case "pause":
			v, err := failure.ParsePause(spec)
			if err != nil {
				return err
			}
			f.in.Pause = append(f.in.Pause, v)
		default:
			v, err := failure.ParseWrongOp(spec)
			if err != nil {
				return err
			}
			f.in.WrongOp = append(f.in.WrongOp, v)
		}
		f.text = append(f.text, spec)
	}
	return nil
}

// s3Flags are explicit S3 credentials; the library hands them to workers
// in their environment, never on a command line.
type s3Flags struct {
	accessKey, secretKey string
}

func (s *s3Flags) register(fs *pflag.FlagSet) {
	fs.StringVar(&s.accessKey, "s3-access-key", "", "S3 access key for --checkpoint (default: AWS_ACCESS_KEY_ID, MINIO_ROOT_USER, ~/.aws/credentials)")
	fs.StringVar(&s.secretKey, "s3-secret-key", "", "S3 secret key for --checkpoint (default: AWS_SECRET_ACCESS_KEY, ...); prefer the environment,\nwhich other users of the host cannot read from the process list")
}

func (s *s3Flags) credentials() checkpoint.Credentials {
	return checkpoint.Credentials{AccessKey: s.accessKey, SecretKey: s.secretKey}
}

func endpointList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
