// Package kindtest is a third job kind, as small as one can be and still
// be elastic: its workers run barriers on a ring, one a step, under the
// coordinator, and close ranks when one falls. It exists to prove that a
// kind plugs into the shared launcher and role dispatch (package job)
// through Registry.AddKind alone; the tests register it.
package kindtest

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/job"
)

// Kind is the barrier kind: a model names it (ModelSpec.Kind "barrier").
type Kind struct{}

// Spec is a model of the barrier kind, "barriers": it has nothing but its
// kind.
func Spec() job.ModelSpec {
	return job.ModelSpec{Name: "barriers", Kind: "barrier", Summary: "barriers on an elastic ring, one a step"}
}

// Registry is reg with the barrier kind and its model added.
func Registry(reg *job.Registry) *job.Registry {
	r := job.NewRegistry(nil, append(reg.Specs(), Spec())...)
	for _, k := range reg.Kinds() {
		if err := r.AddKind(k); err != nil {
			panic(err)
		}
	}
	if err := r.AddKind(Kind{}); err != nil {
		panic(err)
	}
	return r
}

// Unchecked tells the chaos harness what a barrier job has not: samples
// (invariant 2) and parameters (3 and 4).
func (Kind) Unchecked() map[int]string {
	return map[int]string{
		2: "a barrier job trains on no samples",
		3: "a barrier job holds no parameters",
		4: "a barrier job has no model to compare with its undisturbed run's",
	}
}

// Name is "barrier".
func (Kind) Name() string { return "barrier" }

// Owns no model that does not name it.
func (Kind) Owns(job.ModelSpec, *job.Config) bool { return false }

// Worker is the one role.
func (Kind) Worker() string { return "barrier-worker" }

// Roles: every process is a barrier worker.
func (Kind) Roles() map[string]job.Role { return map[string]job.Role{"barrier-worker": runWorker} }

// Prepare checks what the kind reads: the common settings and the ring's
// bounds.
func (Kind) Prepare(_ context.Context, lc *job.LaunchConfig, _ job.ModelSpec, _ job.Options) (job.Job, error) {
	if err := lc.Config.ValidateCommon(); err != nil {
		return nil, err
	}
	if lc.MinWorkers < 1 || lc.MaxWorkers < lc.MinWorkers {
		return nil, job.Invalid("MinWorkers", lc.MinWorkers, "want 1 <= MinWorkers <= MaxWorkers (%d)", lc.MaxWorkers)
	}
	return prepared{}, nil
}

type prepared struct{}

// Run runs a coordinator and the workers, and turns their reports and the
// generations into events, until rank 0 says done.
func (prepared) Run(outer, ctx context.Context, cancel context.CancelFunc, env *job.Env) (*job.Result, error) {
	lc := env.LC
	el, err := env.StartElastic(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { cancel(); el.Wait() }()
	if err := env.StartWorkers(ctx, "barrier-worker", 0); err != nil {
		return nil, err
	}
	var done *Done
	types := job.NewReportTypes(Step{}, Done{})
	var first uint64 // the first generation's number
	for running := lc.Workers; running > 0; {
		select {
		case <-outer.Done():
			return nil, context.Cause(outer)
		case g := <-el.Generations:
			if first == 0 {
				first = g.Number
			}
			job.GenerationEvents(env.Events, g, first)
		case l := <-env.Procs.Lines():
			rep, err := types.Parse(l)
			if err != nil {
				return nil, err
			}
			switch rep := rep.(type) {
			case Step:
				job.Emit(env.Events, l.Index, rep)
			case Done:
				done = &rep
				job.Emit(env.Events, l.Index, rep)
			case job.Failed:
				env.Procs.Signal("", syscall.SIGKILL)
				return nil, fmt.Errorf("worker %d failed: %s", l.Index, rep.Reason)
			}
		case x := <-env.Procs.Exits():
			running--
			env.Events.Emit("worker_exited", events.F("worker", x.Index), events.F("pid", x.Pid), events.F("status", job.ExitText(x.Err)))
		}
	}
	for {
		select {
		case l := <-env.Procs.Lines():
			if rep, err := types.Parse(l); err == nil && done == nil {
				if d, ok := rep.(Done); ok {
					done = &d
				}
			}
			continue
		default:
		}
		break
	}
	if done == nil {
		return nil, errors.New("kindtest: every worker ended and none said done")
	}
	return &job.Result{Step: done.Step, Generation: done.Generation, World: done.World}, nil
}

// runWorker runs barriers until the job's last step, in every generation
// it is given: a ring's ranks first agree on the step they reached.
func runWorker(ctx context.Context, cfg job.Config, _ *job.Registry) (*job.Result, error) {
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	sec, err := job.LoadSecurity(&cfg)
	if err != nil {
		return nil, err
	}
	tr, err := collective.ListenTCP(collective.TCPOptions{Bind: cfg.Bind, Advertise: cfg.Advertise, Job: cfg.Job, Logger: log, TLS: sec.Transport()})
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	cli, err := job.DialEtcd(ctx, &cfg, log)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	keys, err := coordinator.KeysFor(cfg.Job)
	if err != nil {
		return nil, err
	}
	agent, err := elastic.New(elastic.Config{Coord: coordinator.NewJob(cli, keys), Job: cfg.Job, Transport: tr,
		Collective: collective.Options{Timeout: cfg.OpTimeout, Logger: log}, DataAddr: tr.Addr(), ControlAddr: tr.Addr(),
		RankHint: cfg.RankHint, LeaseTTL: cfg.LeaseTTL, Unreachable: cfg.Unreachable, Logger: log})
	if err != nil {
		return nil, err
	}
	rep := job.NewReporter(cfg.Reports)
	var step int64
	var res job.Result
	err = agent.Run(ctx, func(ctx context.Context, r *elastic.Round) error {
		reached := []float64{float64(step)}
		if err := r.Group.AllReduce(ctx, collective.Float64s(reached), collective.Max); err != nil {
			return err
		}
		step = int64(reached[0])
		gen, world := r.Generation.Number, r.Group.Size()
		for step < cfg.Steps {
			if err := r.Group.Barrier(ctx); err != nil {
				return err
			}
			step++
			if r.Rank == 0 {
				rep.Send(Step{Step: step, Generation: gen, World: world})
			}
		}
		res = job.Result{Step: step, Generation: gen, World: world}
		if r.Rank == 0 {
			rep.Send(Done{Step: step, Generation: gen, World: world})
		}
		return r.Group.Barrier(ctx) // no rank leaves while another still steps
	})
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// Step: rank 0 of a ring passed a barrier step; Done: it reached the
// job's last step. The barrier kind's own reports.
type (
	Step struct {
		Step       int64  `json:"step"`
		Generation uint64 `json:"generation"`
		World      int    `json:"world"`
	}
	Done Step
)

// ReportKind is "step".
func (Step) ReportKind() string { return "step" }

// ReportKind is "done".
func (Done) ReportKind() string { return "done" }

// Event is step.
func (r Step) Event(int) (string, []events.Field) {
	return "step", []events.Field{events.F("step", r.Step), events.F("generation", r.Generation), events.F("world", r.World)}
}

// Event is done.
func (r Done) Event(int) (string, []events.Field) {
	return "done", []events.Field{events.F("step", r.Step), events.F("generation", r.Generation), events.F("world", r.World)}
}
