package elastic

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Config configures an Agent.
type Config struct {
	// Coord is the job's records in etcd (its client and keys).
	Coord *coordinator.Job
	// Job names the collective job: every frame carries it.
	Job        string
	Transport  collective.Transport
	Collective collective.Options
	// The worker's addresses: its data plane (Transport's advertised
	// address) and its control plane (the actor system's).
	DataAddr, ControlAddr string
	Host                  string
	// HostIdentity says which workers share this host's memory
	// (collective.HostIdentity); empty: none, every peer is reached over
	// the network.
	HostIdentity string
	RankHint     int // preferred rank, -1 for none
	Capabilities []string
	// ConfigHash identifies the training configuration; a worker whose hash
	// differs from the job's is refused before it registers.
	ConfigHash string
	// LeaseTTL is the registration lease (default 5s): a frozen or
	// partitioned worker is removed this long after its last keep-alive.
	LeaseTTL time.Duration
	// Unreachable bounds how long the worker goes on without etcd (its lease
	// cannot be renewed) or without a decision after its ring broke, before
	// it fails (default 60s). Training continues meanwhile as long as the
	// membership is unchanged.
	Unreachable time.Duration
	Logger      *zap.Logger
	Now         func() time.Time
	// ID names the worker; the default is made of host, pid and start time.
	ID string
	// JoinTimeout bounds the building of a ring (default 3s). Every member
	// listens before it registers, so a member that cannot be reached by then
	// is reported (and removed once the coordinator's probe confirms it).
	JoinTimeout time.Duration
}

// Round is one generation as the worker lives it.
type Round struct {
	Generation *phalanxpb.Generation
	Group      *collective.Group
	Rank       int
	// Previous is the generation this worker trained in before; nil in its
	// first round (it is a newcomer and holds no state worth keeping).
	Previous *phalanxpb.Generation
}

// Body trains in one round. It returns nil when the job is complete, and must
// return soon after its context is cancelled (a newer generation) or its
// group fails.
type Body func(ctx context.Context, r *Round) error

// ErrGenerationChanged is the cause of a round's cancellation when the
// coordinator decided a newer generation.
var ErrGenerationChanged = errors.New("elastic: a new generation was decided")

// ErrUnreachable: etcd or the coordinator could not be reached for longer
// than Config.Unreachable.
var ErrUnreachable = errors.New("elastic: membership unreachable")

// ErrLeft: the worker left the job on request (Agent.Leave); the others go
// on without it.
var ErrLeft = errors.New("elastic: left the job on request")

// StoppedError: the job stopped before its last step, and this worker with
// it. The coordinator stops a job that stays below its minimum of workers
// (Reason, in Generation); requested stops (phalanx.Stop, or a signal to
// the launcher) come after a final checkpoint at a step boundary (Step,
// Requested), and the same configuration resumes from it. It is the one
// stop error: the root package and package job name it too.
type StoppedError struct {
	Step       int64
	Requested  bool
	Reason     string
	Generation uint64 // the coordinator's empty generation that stopped the job
	// Checkpoint names the final checkpoint, found complete in the store
	// (set by the launcher).
	Checkpoint string
}

// Error says why the job stopped.
func (e *StoppedError) Error() string {
	switch {
	case e.Requested && e.Checkpoint != "":
		return fmt.Sprintf("phalanx: stopped at step %d after a final checkpoint (%s); launch the same job again to resume", e.Step, e.Checkpoint)
	case e.Requested:
		return fmt.Sprintf("phalanx: stopped on request at step %d, after a final checkpoint", e.Step)
	}
	return fmt.Sprintf("phalanx: the coordinator stopped the job: %s", e.Reason)
}

// ConfigMismatchError: this worker's training configuration is not the job's.
type ConfigMismatchError struct{ Job, Ours, Theirs string }

func (e *ConfigMismatchError) Error() string {
	return fmt.Sprintf("elastic: job %s trains configuration %s, this worker has %s: start every worker with the same training flags",
		e.Job, e.Theirs, e.Ours)
}

// Agent runs a worker through the job's generations.
type Agent struct {
	cfg Config
	log *zap.Logger
	id  string

	mu    sync.Mutex
	lease *coordinator.Lease

	leaveOnce sync.Once
	leaving   chan struct{} // closed by Leave
}

// New checks cfg and names the worker: host, pid and start time make an id no
// other worker process has.
func New(cfg Config) (*Agent, error) {
	switch {
	case cfg.Coord == nil || cfg.Coord.Client() == nil || cfg.Transport == nil:
		return nil, fmt.Errorf("elastic: an etcd client and a transport are needed")
	case cfg.Coord.Keys().Prefix() == "":
		return nil, fmt.Errorf("elastic: no job keys")
	case cfg.DataAddr == "":
		return nil, fmt.Errorf("elastic: no data-plane address to register")
	case cfg.LeaseTTL < 0 || cfg.Unreachable < 0:
		return nil, fmt.Errorf("elastic: durations must not be negative")
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 5 * time.Second
	}
	if cfg.Unreachable == 0 {
		cfg.Unreachable = time.Minute
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = 3 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Host == "" {
		cfg.Host, _ = os.Hostname()
	}
	if cfg.Job == "" {
		cfg.Job = cfg.Coord.Keys().Prefix()
	}
	id := cfg.ID
	if id == "" {
		id = fmt.Sprintf("%s-%d-%s", cfg.Host, os.Getpid(), strconv.FormatInt(cfg.Now().UnixNano()%1e9, 36))
	}
	return &Agent{cfg: cfg, id: id, log: cfg.Logger.With(zap.String("worker", id)), leaving: make(chan struct{})}, nil
}

// Leave takes the worker out of the job on request (a SIGTERM, a drained
// node): it records why and withdraws its registration, so the coordinator
// decides a ring without it at once and names it as left. The round in
// flight goes on until that generation ends it (or until the body returns);
// then Run returns ErrLeft. The others lose no committed step.
func (a *Agent) Leave(ctx context.Context, reason string) error {
	first := false
	a.leaveOnce.Do(func() { close(a.leaving); first = true })
	if !first {
		return nil
	}
	a.log.Info("leaving the job", zap.String("reason", reason))
	err := a.cfg.Coord.Leave(ctx, a.id, reason)
	if l := a.currentLease(); l != nil {
		err = errors.Join(err, l.Close(ctx))
	}
	return err
}

// Leaving is closed once Leave was called.
func (a *Agent) Leaving() <-chan struct{} { return a.leaving }

func (a *Agent) isLeaving() bool {
	select {
	case <-a.leaving:
		return true
	default:
		return false
	}
}

// ID is the worker's id in the job.
func (a *Agent) ID() string { return a.id }

func (a *Agent) registration() *phalanxpb.Registration {
	return &phalanxpb.Registration{Id: a.id, DataAddr: a.cfg.DataAddr, ControlAddr: a.cfg.ControlAddr,
		RankHint: int32(a.cfg.RankHint), Pid: int64(os.Getpid()), Host: a.cfg.Host,
		HostIdentity: a.cfg.HostIdentity,
		Capabilities: a.cfg.Capabilities, RegisteredUnixNano: a.cfg.Now().UnixNano()}
}

// checkConfig records the job's configuration hash, or compares ours with
// the one recorded.
func (a *Agent) checkConfig(ctx context.Context) error {
	if a.cfg.ConfigHash == "" {
		return nil
	}
	var theirs string
	err := coordinator.Retry(ctx, a.cfg.Unreachable, a.retrying("recording the job configuration"), func(ctx context.Context) (err error) {
		theirs, err = a.cfg.Coord.ClaimConfig(ctx, a.cfg.ConfigHash)
		return err
	})
	if err != nil {
		return fmt.Errorf("elastic: %w", err)
	}
	if theirs != a.cfg.ConfigHash {
		return &ConfigMismatchError{Job: a.cfg.Coord.Keys().Prefix(), Ours: a.cfg.ConfigHash, Theirs: theirs}
	}
	return nil
}

// Run registers the worker and trains through the generations until body
// returns nil in some round (the job is complete: Run records it, so the
// coordinator and waiting workers end too), the job is done or stopped, a
// round fails for a reason that is not a membership change, or ctx ends.
func (a *Agent) Run(ctx context.Context, body Body) error {
	if err := a.checkConfig(ctx); err != nil {
		return err
	}
	var lease *coordinator.Lease
	err := coordinator.Retry(ctx, a.cfg.Unreachable, a.retrying("registering"), func(ctx context.Context) (err error) {
		lease, err = a.cfg.Coord.Register(ctx, a.registration(), a.cfg.LeaseTTL)
		return err
	})
	if err != nil {
		return err
	}
	a.setLease(lease)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		a.currentLease().Close(cctx)
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := startWatch(ctx, a.cfg.Coord, a.log)
	go a.keepRegistered(ctx, cancel)

	var prev *phalanxpb.Generation
	var seen uint64
	brokeAt := time.Time{}
	for {
		g, err := a.await(ctx, w, seen, brokeAt)
		if err != nil {
			return err
		}
		if g == nil {
			return nil // done by the others
		}
		seen = g.Number
		done, err := a.round(ctx, w, g, prev, body)
		switch {
		case done:
			a.recordDone(ctx, g.Number)
			return nil
		case a.isLeaving():
			return ErrLeft
		case err != nil:
			return err
		}
		prev = g
		brokeAt = a.cfg.Now()
	}
}

// retrying logs a transient etcd failure of what, about to be retried (an
// election in the etcd cluster fails requests for a second or two).
func (a *Agent) retrying(what string) func(error) {
	return func(err error) { a.log.Warn(what+": etcd unavailable; retrying", zap.Error(err)) }
}

// recordDone writes the job's done key, retrying through etcd trouble (a
// leader election fails writes for a second or two) for up to
// Config.Unreachable: without it the coordinator would take the workers'
// exits for losses.
func (a *Agent) recordDone(ctx context.Context, gen uint64) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Unreachable)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		err := a.cfg.Coord.MarkDone(ctx, gen)
		if err == nil {
			return
		}
		a.log.Warn("recording that the job is done; retrying", zap.Error(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			a.log.Warn("the job's done key could not be written; the coordinator may take this worker's exit for a loss", zap.Error(err))
			return
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func (a *Agent) setLease(l *coordinator.Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lease = l
}

func (a *Agent) currentLease() *coordinator.Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lease
}

// keepRegistered re-registers the worker when its lease is lost (expired
// while the process was frozen, or etcd unreachable), and gives up — ending
// the worker — once etcd stays unreachable for longer than Unreachable.
func (a *Agent) keepRegistered(ctx context.Context, fail context.CancelCauseFunc) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.currentLease().Lost():
		}
		if ctx.Err() != nil || a.isLeaving() {
			return
		}
		a.log.Warn("registration lease lost; registering again")
		since := a.cfg.Now()
		backoff := 100 * time.Millisecond
		for {
			rctx, cancel := context.WithTimeout(ctx, a.cfg.LeaseTTL)
			l, err := a.cfg.Coord.Register(rctx, a.registration(), a.cfg.LeaseTTL)
			cancel()
			if err == nil {
				a.setLease(l)
				a.log.Info("registered again")
				break
			}
			if ctx.Err() != nil {
				return
			}
			if a.cfg.Now().Sub(since) > a.cfg.Unreachable {
				fail(fmt.Errorf("%w: no lease from etcd for %s: %v", ErrUnreachable, a.cfg.Unreachable, err))
				return
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// await waits for a generation newer than seen that has this worker as a
// member. It returns nil when the job is done, a StoppedError when the
// coordinator stopped it, and ErrUnreachable when the ring broke at brokeAt
// and no decision followed within Unreachable.
func (a *Agent) await(ctx context.Context, w *watch, seen uint64, brokeAt time.Time) (*phalanxpb.Generation, error) {
	var timeout <-chan time.Time
	if !brokeAt.IsZero() {
		t := time.NewTimer(a.cfg.Unreachable - a.cfg.Now().Sub(brokeAt))
		defer t.Stop()
		timeout = t.C
	}
	for {
		g, done, changed, err := w.state()
		switch {
		case err != nil:
			return nil, err
		case done:
			return nil, nil
		case a.isLeaving():
			return nil, ErrLeft
		case g != nil && g.Number > seen && g.Stopped:
			return nil, &StoppedError{Generation: g.Number, Reason: g.Reason}
		case g != nil && g.Number > seen && rankOf(g, a.id) >= 0:
			return g, nil
		}
		select {
		case <-changed:
		case <-a.leaving:
		case <-timeout:
			return nil, fmt.Errorf("%w: no new generation within %s of the ring breaking: is a coordinator running?", ErrUnreachable, a.cfg.Unreachable)
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

func rankOf(g *phalanxpb.Generation, id string) int {
	for i, m := range g.Members {
		if m.Id == id {
			return i
		}
	}
	return -1
}

// round builds generation g's group and runs body in it. It reports done
// when body completed the job, and an error only when the worker must stop;
// a membership change returns (false, nil).
func (a *Agent) round(ctx context.Context, w *watch, g *phalanxpb.Generation, prev *phalanxpb.Generation, body Body) (done bool, err error) {
	rank := rankOf(g, a.id)
	log := a.log.With(zap.Uint64("generation", g.Number), zap.Int("rank", rank))
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu    sync.Mutex
		group *collective.Group
	)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // a newer generation (or the job's end) ends the round
		for {
			cur, fin, changed, _ := w.state()
			if fin || (cur != nil && cur.Number > g.Number) {
				why := "the job is done"
				if cur != nil && cur.Number > g.Number {
					why = fmt.Sprintf("generation %d decided", cur.Number)
				}
				cancel(fmt.Errorf("%w: %s while in generation %d", ErrGenerationChanged, why, g.Number))
				mu.Lock()
				if group != nil {
					group.Abort(why)
				}
				mu.Unlock()
				return
			}
			select {
			case <-changed:
			case <-stop:
				return
			}
		}
	}()

	m := collective.Membership{Job: a.cfg.Job, Generation: g.Number, Rank: rank, Peers: make([]string, len(g.Members)),
		Hosts: make([]string, len(g.Members))}
	known := true
	for i, mem := range g.Members {
		m.Peers[i], m.Hosts[i] = mem.DataAddr, mem.HostIdentity
		known = known && mem.HostIdentity != ""
	}
	if !known {
		m.Hosts = nil // a member that did not say: every pair over the network
	}
	jctx, jcancel := context.WithTimeout(rctx, a.cfg.JoinTimeout)
	grp, err := collective.Join(jctx, a.cfg.Transport, m, a.cfg.Collective)
	jcancel()
	if err != nil {
		if rctx.Err() == nil {
			log.Warn("building the ring failed", zap.Error(err))
			a.report(ctx, g, err)
		}
		return false, nil
	}
	mu.Lock()
	group = grp
	if rctx.Err() != nil {
		grp.Abort("generation changed")
	}
	mu.Unlock()
	defer grp.Close()
	// A broken ring is reported at once, even between operations, and
	// once. A newer generation ending the round does not stop the report
	// either: the group is aborted then, and report drops what an abort
	// reports, but a peer lost before it (a newcomer's generation decided
	// while the loss was on its way) is still news — that generation may
	// hold the lost worker, and the coordinator probes a report about an
	// older generation naming a current member. Nor does the round's own
	// end: the body may return on the group's failure and end the round
	// before this goroutine runs, and the coordinator would then learn of
	// the loss only from the lost worker's lease.
	var reported sync.Once
	reportFailure := func() {
		reported.Do(func() { a.report(ctx, g, grp.Err()) })
	}
	go func() {
		select {
		case <-grp.Failed():
			reportFailure()
		case <-stop:
		}
	}()
	log.Info("training in a new generation", zap.Int("world", len(g.Members)))
	err = body(rctx, &Round{Generation: g, Group: grp, Rank: rank, Previous: prev})
	switch {
	case err == nil:
		return true, nil
	case isDeterministic(err):
		// Met by every rank at the same step: the job's end, even when a
		// peer that met it first has already left the ring.
	case rctx.Err() != nil && ctx.Err() == nil:
		log.Info("round ended by a membership change", zap.NamedError("cause", context.Cause(rctx)), zap.Error(err))
		return false, nil
	case ctx.Err() != nil:
		return false, context.Cause(ctx)
	case isRingFailure(err):
		select {
		case <-grp.Failed(): // the round's own group broke: its loss is reported before the round ends
			reportFailure()
		default:
		}
		grp.Abort("ring broken")
		log.Warn("ring broken; waiting for the coordinator's decision", zap.Error(err))
		return false, nil
	}
	grp.Abort(err.Error())
	return false, err
}

// deterministic is a body's error that every rank meets at the same step
// (a NaN in the reduced gradients): a new generation would meet it again.
type deterministic interface{ Deterministic() bool }

func isDeterministic(err error) bool {
	var d deterministic
	return errors.As(err, &d) && d.Deterministic()
}

// isRingFailure: err comes from the collective group breaking, which a new
// generation repairs.
func isRingFailure(err error) bool {
	for _, k := range []error{collective.ErrPeerLost, collective.ErrTimeout, collective.ErrAborted, collective.ErrClosed,
		collective.ErrProtocol, collective.ErrMismatch} {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

// report tells the coordinator that generation g's ring broke, naming the
// peer when the error does.
func (a *Agent) report(ctx context.Context, g *phalanxpb.Generation, err error) {
	var oe *collective.OpError
	lost, detail := "", "ring broken"
	if errors.As(err, &oe) {
		switch {
		case errors.Is(oe.Kind, collective.ErrAborted) || errors.Is(oe.Kind, collective.ErrClosed):
			return // someone else's decision, already reported or made
		case oe.Rank >= 0 && oe.Rank < len(g.Members) && (errors.Is(oe.Kind, collective.ErrPeerLost) || errors.Is(oe.Kind, collective.ErrTimeout)):
			lost, detail = g.Members[oe.Rank].Id, fmt.Sprintf("%s (rank %d)", oe.Kind, oe.Rank)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, a.cfg.LeaseTTL)
	defer cancel()
	r := &phalanxpb.LossReport{ReporterId: a.id, LostId: lost, Generation: g.Number, Detail: detail}
	if err := a.cfg.Coord.ReportLoss(rctx, r); err != nil {
		a.log.Warn("reporting a broken ring", zap.Error(err))
	}
}
