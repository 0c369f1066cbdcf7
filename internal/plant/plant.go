// Package plant breaks the runtime on purpose, for the tests that prove the
// chaos invariants and end-to-end checks catch real bugs (as etcd's
// robustness suite reproduces known bugs). It is compiled in only with the
// build tag phalanx_plant: without it On is a constant false and every hook
// compiles away. No flag or configuration reaches it; a test binary built
// with the tag turns a bug on through the PHALANX_PLANT environment
// variable, which the processes a launcher starts inherit.
package plant

// Bug names one planted bug. Each hook says where and when it strikes.
type Bug string

// The planted bugs.
const (
	// SkipSample: rank 1 trains step 40 without the last sample of its share.
	SkipSample Bug = "skip-sample"
	// DupSample: rank 1 trains step 40 on its share's first sample twice,
	// in place of its last.
	DupSample Bug = "dup-sample"
	// SamplerDup: the sampler's epoch-1 permutation deals one sample twice
	// and another never.
	SamplerDup Bug = "sampler-dup"
	// ParamDrift: from step 40 on, rank 1's first parameter moves by one
	// ulp after every update.
	ParamDrift Bug = "param-drift"
	// HybridUnrecorded: a hybrid step that closes without a late rank
	// reports every rank as a participant: the late rank's samples are
	// dropped without a record.
	HybridUnrecorded Bug = "hybrid-unrecorded"
	// ShortJob: the ring's workers end one step before the job's last.
	ShortJob Bug = "short-job"
	// ForgetMomentum: a restore from a checkpoint leaves the optimizer's
	// slots (momentum) at zero.
	ForgetMomentum Bug = "forget-momentum"
	// PushTwice: a parameter-server shard applies a replayed push it should
	// refuse as a duplicate (ps: shard.take applies it to the rows, counts
	// it as taken and acknowledges it as new), every replay: a worker
	// resending an unacknowledged push after a failover, or an adopter
	// pushing again a step some shard has.
	PushTwice Bug = "push-twice"
	// LoseAckedPush: a primary shard acknowledges a push it never
	// forwarded to its backup (ps: shard.forward skips the backups), once
	// per shard: share 1's push of step 500. The backup, promoted when the
	// primary dies, lacks it.
	LoseAckedPush Bug = "lose-acked-push"
	// CorruptObject: a checkpoint completes with one of its data objects
	// corrupted after its checksum was taken.
	CorruptObject Bug = "corrupt-object"
	// ChangeAfterSave: a checkpoint is rewritten, manifest and all, after
	// it was saved.
	ChangeAfterSave Bug = "change-after-save"
	// LeakProcess: a worker leaves a child process of its own running when
	// it exits.
	LeakProcess Bug = "leak-process"
	// LeakPort: that child holds the worker's data-plane listener open.
	LeakPort Bug = "leak-port"
	// LeakShm: the shared-memory transport never unlinks its files.
	LeakShm Bug = "leak-shm"
	// FaultNoop: the chaos harness's signal faults send signal 0: the
	// fault fires zero times.
	FaultNoop Bug = "fault-noop"
	// SlowRecovery: a worker waits 3 s before it trains in a new
	// generation.
	SlowRecovery Bug = "slow-recovery"
)

// Env is the environment variable that turns bugs on: a comma-separated
// list of Bug names.
const Env = "PHALANX_PLANT"
