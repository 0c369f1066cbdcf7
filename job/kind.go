package job

import (
	"context"
	"fmt"
	"slices"
)

// Kind is a kind of job (a data-parallel ring, a parameter-server job, a
// pipeline...): a package that the shared launcher (Launch) and the role
// dispatch (RunProcess) call, so that a new kind plugs in by being added
// to a Registry, with no branch in either.
type Kind interface {
	// Name names the kind (ModelSpec.Kind, messages).
	Name() string
	// Owns reports whether a model that names no kind is of this one in a
	// job of configuration cfg (a ring model has New, a parameter-server
	// model PS; a model that Splits, with cfg.Pipeline.Tensor above 1, is
	// the pipeline kind's).
	Owns(spec ModelSpec, cfg *Config) bool
	// Prepare checks a launch of this kind before anything starts (its
	// LaunchConfig's own fields are checked), filling in its defaults, and
	// returns the job to run.
	Prepare(ctx context.Context, lc *LaunchConfig, spec ModelSpec, opts Options) (Job, error)
	// Roles are the roles of the kind's processes (unique among kinds)
	// and what runs each.
	Roles() map[string]Role
	// Worker is the role of the process a person starts by hand (phalanx
	// worker, RunModel): it joins a running job of this kind.
	Worker() string
}

// Job is a prepared job of a kind, which the shared launcher runs.
type Job interface {
	// Run runs the job in env to its end: it writes the job's records,
	// starts its processes (Env.Spawn) and turns their reports into events
	// and progress lines. outer is the caller's context, whose end asks the
	// job to stop; ctx is the job's own, which cancel ends (the processes
	// started in it, the etcd client's use).
	Run(outer, ctx context.Context, cancel context.CancelFunc, env *Env) (*Result, error)
}

// Role runs one process of a job: cfg is the job's configuration with the
// process's own place (Index, RankHint, Bind, Logger, Reports) filled in.
type Role func(ctx context.Context, cfg Config, reg *Registry) (*Result, error)

// KindOf is the kind of a model in a job of configuration cfg: the one it
// names, else the first that owns it.
func (r *Registry) KindOf(spec ModelSpec, cfg *Config) (Kind, error) {
	for _, k := range r.kinds {
		if spec.Kind == k.Name() || (spec.Kind == "" && k.Owns(spec, cfg)) {
			return k, nil
		}
	}
	if spec.Kind != "" {
		return nil, fmt.Errorf("phalanx: model %s is of kind %q, which is not registered (kinds: %v)", spec.Name, spec.Kind, r.KindNames())
	}
	return nil, fmt.Errorf("phalanx: model %s is of no registered kind (a ring model has New, a parameter-server model PS)", spec.Name)
}

// Role is the role name of a launched process, and its kind.
func (r *Registry) Role(name string) (Role, bool) {
	for _, k := range r.kinds {
		if f, ok := k.Roles()[name]; ok {
			return f, true
		}
	}
	return nil, false
}

// Kinds are the registered kinds, in registration order.
func (r *Registry) Kinds() []Kind { return slices.Clone(r.kinds) }

// KindNames are the registered kinds' names.
func (r *Registry) KindNames() []string {
	var n []string
	for _, k := range r.kinds {
		n = append(n, k.Name())
	}
	return n
}

// AddKind registers kind k; its name and roles must be new.
func (r *Registry) AddKind(k Kind) error {
	for _, o := range r.kinds {
		if o.Name() == k.Name() {
			return fmt.Errorf("phalanx: job kind %q registered twice", k.Name())
		}
		for role := range k.Roles() {
			if _, ok := o.Roles()[role]; ok {
				return fmt.Errorf("phalanx: job kind %q: role %q is kind %q's", k.Name(), role, o.Name())
			}
		}
	}
	r.kinds = append(slices.Clone(r.kinds), k)
	return nil
}
