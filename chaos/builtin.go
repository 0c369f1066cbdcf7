package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// smallJob is the built-in scenarios' job: the mlp example on synthetic
// data, small enough for a run in seconds on two cores, long enough for a
// fault, the rebuilt ring and a good many steps after it. The job's events
// reach the harness late when its workers crowd the cores (by 50 steps
// and more, seen on two cores): faults trigger by step 100, so even then
// they land while the job runs.
func smallJob(workers int, checkpointEvery int64) JobSpec {
	return JobSpec{Model: "mlp", Options: map[string]string{"samples": "6000", "hidden": "32"},
		Workers: workers, Steps: 400, Batch: 128, Seed: 7, CheckpointEvery: checkpointEvery}
}

// hybridJob is smallJob(4) under hybrid synchronisation, longer: a
// stopped rank's steps close without it at the deadline.
func hybridJob() JobSpec {
	j := smallJob(4, 0)
	j.Kind, j.Steps = "hybrid", 300
	return j
}

// wholeRing is a job that trains only on all its workers: its first ring
// waits for every one of them, so a run and its undisturbed twin sum over
// the same ranks and can be compared bitwise.
func wholeRing(j JobSpec) JobSpec {
	j.MinWorkers = j.Workers
	return j
}

// Builtin are the built-in scenarios, by name; CISet names the short set
// `.ci/run` runs, which covers every built-in fault kind.
func Builtin() []Scenario {
	out := ringScenarios()
	for _, more := range [][]Scenario{etcdScenarios(), minioScenarios(), uploadScenarios(), netnsScenarios(), psScenarios(), pipelineScenarios()} {
		out = append(out, more...)
	}
	return out
}

// ringScenarios are the built-in scenarios of ring jobs on loopback.
func ringScenarios() []Scenario {
	return []Scenario{
		{Name: "kill-random", Description: "SIGKILL of a random worker at a random step; the others close ranks",
			Job:    smallJob(4, 0),
			Faults: []FaultSpec{{Kind: "sigkill", Target: "random", Trigger: Trigger{Step: 20, StepMax: 100}}}},
		{Name: "stop-cont", Description: "SIGSTOP of a worker for 1.5s (under the lease and the operation timeout), then SIGCONT: the ring waits, the model is the undisturbed one bitwise",
			Job:    wholeRing(smallJob(3, 0)),
			Faults: []FaultSpec{{Kind: "sigstop", Target: "rank:1", Trigger: Trigger{Step: 30}, Duration: Duration(1500 * time.Millisecond)}}},
		{Name: "term-leave", Description: "SIGTERM of a random worker: it leaves gracefully and the ring shrinks",
			Job:    smallJob(3, 0),
			Faults: []FaultSpec{{Kind: "sigterm", Target: "random", Trigger: Trigger{Step: 30, StepMax: 90}}}},
		{Name: "kill-all-resize", Description: "every worker SIGKILLed; the job is launched again on 2 workers and resumes from its newest checkpoint",
			Job:    smallJob(3, 20),
			Faults: []FaultSpec{{Kind: "kill-all", Trigger: Trigger{Step: 50, StepMax: 70}, World: 2}}},
		{Name: "corrupt-resume", Description: "a byte flipped in the newest checkpoint, then every worker killed: the resume refuses it and takes the one before",
			Job: wholeRing(smallJob(3, 20)),
			Faults: []FaultSpec{
				{Kind: "flip-checkpoint", Trigger: Trigger{Step: 65}},
				{Kind: "kill-all", Trigger: Trigger{Step: 70}},
			}},
		{Name: "lost-manifest", Description: "the newest checkpoint's manifest deleted, then every worker killed: the resume takes the one before",
			Job: wholeRing(smallJob(3, 20)),
			Faults: []FaultSpec{
				{Kind: "delete-manifest", Trigger: Trigger{Step: 65}},
				{Kind: "kill-all", Trigger: Trigger{Step: 70}},
			}},
		{Name: "changed-manifest", CI: true,
			Description: "one byte of the newest checkpoint's manifest changed, then every worker killed: the resume refuses it by the manifest's own checksum and takes the one before",
			Job:         wholeRing(smallJob(3, 20)),
			Faults: []FaultSpec{
				{Kind: "flip-manifest", Trigger: Trigger{Step: 65}},
				{Kind: "kill-all", Trigger: Trigger{Step: 70}},
			}},
		{Name: "hybrid-stop", CI: true,
			Description: "a hybrid job (ranks wait for each other up to a deadline) with a worker SIGSTOPped for 2s: steps close without it, its late gradients are dropped as stale and recorded, " +
				"every sample trained once or recorded dropped, the model within the tolerance of the undisturbed run's",
			Job:    hybridJob(),
			Faults: []FaultSpec{{Kind: "sigstop", Target: "rank:2", Trigger: Trigger{Step: 30}, Duration: Duration(2 * time.Second)}}},
		{Name: "garbage", Description: "garbage, truncated, oversized and foreign-job frames to every data-plane port: refused, and the ring trains on bitwise",
			Job:    wholeRing(smallJob(3, 0)),
			Faults: []FaultSpec{{Kind: "garbage-frames", Trigger: Trigger{Step: 30}}}},
	}
}

// CISet is the short set of built-in scenarios `.ci/run` runs: every
// built-in fault kind at least once.
// Besides the ring scenarios, every built-in scenario marked CI joins it.
func CISet() []string {
	out := []string{"kill-random", "stop-cont", "term-leave", "kill-all-resize", "corrupt-resume", "lost-manifest", "garbage"}
	for _, s := range Builtin() {
		if s.CI && !slices.Contains(out, s.Name) {
			out = append(out, s.Name)
		}
	}
	return out
}

// Lookup finds a built-in scenario.
func Lookup(name string) (Scenario, error) {
	for _, s := range Builtin() {
		if s.Name == name {
			return s, nil
		}
	}
	var names []string
	for _, s := range Builtin() {
		names = append(names, s.Name)
	}
	return Scenario{}, fmt.Errorf("%w: no built-in scenario %q (built in: %v)", ErrScenario, name, names)
}

// SoakConfig is a soak: faults drawn at random for Duration.
type SoakConfig struct {
	Duration time.Duration
	// MeanInterval is the mean time between faults (default 20s).
	MeanInterval time.Duration
	Seed         uint64
	// Kinds drawn from (default: sigkill, sigstop, sigterm, garbage-frames).
	Kinds []string
	// Workers per job (default 4).
	Workers int
}

// soakKinds are the faults a soak draws by default: those a running ring
// survives without a relaunch.
func soakKinds() []string { return []string{"sigkill", "sigstop", "sigterm", "garbage-frames"} }

// Soak runs jobs back to back for the soak's duration, each with faults
// drawn at random at the mean interval (a job loses at most all but one
// of its workers), and returns every run's report.
func (r *Runner) Soak(ctx context.Context, sc SoakConfig) ([]*Report, error) {
	if sc.Duration <= 0 {
		return nil, fmt.Errorf("%w: a soak needs a positive duration", ErrScenario)
	}
	if sc.MeanInterval <= 0 {
		sc.MeanInterval = 20 * time.Second
	}
	if sc.Workers == 0 {
		sc.Workers = 4
	}
	if sc.Workers < 2 {
		return nil, fmt.Errorf("%w: a soak needs at least 2 workers", ErrScenario)
	}
	kinds := sc.Kinds
	if len(kinds) == 0 {
		kinds = soakKinds()
	}
	known := r.kinds()
	for _, k := range kinds {
		if _, ok := known[k]; !ok || k == "kill-all" || known[k].NeedsCheckpoints {
			return nil, fmt.Errorf("%w: soak fault kind %q: want one of %v", ErrScenario, k, soakKinds())
		}
	}
	rng := rand.New(rand.NewPCG(sc.Seed, 0x50a4))
	job := smallJob(sc.Workers, 0)
	job.Steps = 600
	base := Scenario{Name: "soak", Job: job}
	ref, err := r.Reference(ctx, &base)
	if err != nil {
		return nil, err
	}
	// Steps per second of the undisturbed job, to place faults in time.
	rate := float64(job.Steps) / max(ref.Events[len(ref.Events)-1].At.Sub(ref.Events[0].At).Seconds(), 1)
	start := r.now()
	end := start.Add(sc.Duration)
	// Faults arrive as one Poisson process over the whole soak: next is
	// the next one's time from the start, carried from job to job.
	next := rng.ExpFloat64() * sc.MeanInterval.Seconds()
	var reports []*Report
	for k := 0; r.now().Before(end) && ctx.Err() == nil; k++ {
		s := base
		s.Name = fmt.Sprintf("soak-%d", k)
		kills := 0
		at := r.now().Sub(start).Seconds() // this job's start, about
		for {
			step := max(1, int64((next-at)*rate))
			if step >= job.Steps-20 {
				break
			}
			next += rng.ExpFloat64() * sc.MeanInterval.Seconds()
			kind := kinds[rng.IntN(len(kinds))]
			if (kind == "sigkill" || kind == "sigterm") && kills >= sc.Workers-1 {
				kind = "sigstop"
			}
			f := FaultSpec{Kind: kind, Trigger: Trigger{Step: step}}
			switch kind {
			case "sigkill", "sigterm":
				kills++
				f.Target = "random"
			case "sigstop":
				f.Target, f.Duration = "random", Duration(time.Second)
			}
			s.Faults = append(s.Faults, f)
		}
		rep, err := r.Run(ctx, s, sc.Seed+uint64(k))
		if err != nil {
			return reports, err
		}
		reports = append(reports, rep)
	}
	return reports, nil
}

// FaultCount is how many faults reports injected.
func FaultCount(reports []*Report) int {
	n := 0
	for _, r := range reports {
		n += len(slices.DeleteFunc(slices.Clone(r.Faults), func(f *FaultRecord) bool { return f.Injected.IsZero() }))
	}
	return n
}

// pipelineJob is the pipeline scenarios' job: the deep-mlp example, small
// (4 hidden layers of 64 on a 64-feature teacher task), replicas ×
// stages workers.
func pipelineJob(replicas, stages int, checkpointEvery int64) JobSpec {
	return JobSpec{Kind: "pipeline", Model: "deep-mlp",
		Options: map[string]string{"depth": "4", "width": "64", "features": "64", "samples": "4096"},
		Workers: replicas * stages, MinWorkers: 1, Steps: 400, Batch: 64, Seed: 7, CheckpointEvery: checkpointEvery,
		Pipeline: &PipelineSpec{Stages: stages, Replicas: replicas, MicroBatches: 4, CommitEvery: 5}}
}

// tensorJob is the tensor-parallel scenarios' job: the gpt example, small
// (width 32, one block of 2 heads, windows of 32 characters, 1 MiB of the
// Go source), replicas × ranks workers.
func tensorJob(replicas, ranks int) JobSpec {
	return JobSpec{Kind: "pipeline", Model: "gpt",
		Options: map[string]string{"width": "32", "depth": "1", "heads": "2", "context": "32", "corpus-mb": "1", "eval-windows": "32"},
		Workers: replicas * ranks, MinWorkers: 1, Steps: 400, Batch: 16, Seed: 7,
		Pipeline: &PipelineSpec{Stages: 1, Replicas: replicas, MicroBatches: 1, CommitEvery: 5, Tensor: ranks}}
}

// pipelineScenarios kill stages of pipeline jobs: of a replica among two
// (it drops out, the other goes on, the launcher's replacement re-forms
// it), of a lone pipeline (the replacement takes the stage from the copy
// in its neighbour's memory), and both stages of a lone pipeline (the
// copies gone too: the newest checkpoint).
func pipelineScenarios() []Scenario {
	return []Scenario{
		{Name: "stage-kill", CI: true, RecoveryBound: Duration(time.Second),
			Description: "dp2×pp2: SIGKILL of a random stage of a random replica at a random step; its replica drops out, the other goes on (no step redone but the one in flight, when the lost replica had applied it first), a replacement re-forms it from the other's parameters",
			Job:         pipelineJob(2, 2, 0),
			Faults:      []FaultSpec{{Kind: "sigkill", Target: "random", Trigger: Trigger{Step: 40, StepMax: 120}}}},
		{Name: "stage-kill-alone", CI: true, RecoveryBound: Duration(2 * time.Second),
			Description: "pp2, one replica: SIGKILL of stage 1; the replacement takes its state from the commit in stage 0's memory, stage 0 rolls back to its own commit of that step",
			Job:         pipelineJob(1, 2, 0),
			Faults:      []FaultSpec{{Kind: "sigkill", Target: "rank:1", Trigger: Trigger{Step: 60}}}},
		{Name: "tp-rank-kill", CI: true, RecoveryBound: Duration(time.Second),
			Description: "dp2×tp2 (gpt): SIGKILL of a random tensor-parallel rank of a random replica at a random step; its replica drops out, the other goes on with no step redone, a replacement re-forms it from the other's parameters",
			Job:         tensorJob(2, 2),
			Faults:      []FaultSpec{{Kind: "sigkill", Target: "random", Trigger: Trigger{Step: 40, StepMax: 120}}}},
		{Name: "stage-kill-both", CI: true,
			Description: "pp2, one replica: SIGKILL of both stages, their commits with them; the replacements restore from the newest checkpoint",
			Job:         pipelineJob(1, 2, 20),
			// Once a checkpoint is indexed: at a fixed step, a loaded
			// machine may not have indexed one yet, and the job would
			// rightly start over.
			Faults: []FaultSpec{{Kind: "sigkill", Target: "rank:0", Trigger: Trigger{Step: 60, On: "checkpoint"}},
				{Kind: "sigkill", Target: "rank:1", Trigger: Trigger{Step: 60, On: "checkpoint"}}}},
	}
}
