package coordinator

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Config tunes a Coordinator.
type Config struct {
	ID         string // this coordinator's name in the election
	Rendezvous Rendezvous
	// JoinWindow is how long a newcomer waits so that newcomers arriving
	// together enter one generation (default 1s). The first rendezvous waits
	// for MinWorkers only.
	JoinWindow time.Duration
	// MinWorkersTimeout is how long a job may stay below MinWorkers before the
	// coordinator stops it with an empty generation (default 60s).
	MinWorkersTimeout time.Duration
	// FirstRing: the job's first generation waits until this many workers
	// are live (a launcher knows how many it started), or until
	// FirstRingWait has passed since the first of them registered; then the
	// rendezvous takes whoever is live, down to MinWorkers. 0: no wait. A
	// first ring formed of the early registrants only would train its
	// first steps on fewer ranks, and a relaunched job would not be
	// bitwise the one it replaces.
	FirstRing     int
	FirstRingWait time.Duration
	// SessionTTL is the leadership lease (default 5s): a dead coordinator's
	// standby takes over within it.
	SessionTTL time.Duration
	// Probe checks a reported loss: nil means the worker answered, within
	// ProbeTimeout (default 500ms). Default: a TCP dial of its control
	// address (else its data address), which a killed process's listener
	// may still complete for a few milliseconds; a launcher gives a probe
	// its workers' own code must answer (job: collective.Probe of the data
	// plane).
	Probe        func(ctx context.Context, r *phalanxpb.Registration) error
	ProbeTimeout time.Duration
	Now          func() time.Time
	Logger       *zap.Logger
	// OnDecision observes every generation this coordinator writes.
	OnDecision func(*phalanxpb.Generation)
	// OnLeadership observes this coordinator winning its election and
	// stepping down.
	OnLeadership func(Leadership)
}

// Leadership is a coordinator (or shard-map writer) winning its election
// or stepping down, as told to an observer.
type Leadership struct {
	Leading bool
	// Key and Rev are its election key and the key's create revision:
	// what each of its requests while leading compares, so that none
	// lands once the key is gone (its session expired) or replaced.
	Key string
	Rev int64
	// Err is why it stepped down (Leading false).
	Err error
}

// fence is a leader's election key and its create revision: a request
// made under it holds only while the key is the one this leader created.
// A deposed leader still running (paused past its session TTL, then
// continued) has lost its key with its lease, so its requests fail the
// comparison in etcd itself, whatever it believes.
type fence struct {
	key string
	rev int64
}

func (f fence) held() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev)
}

func (f fence) lost(what string) error {
	return fmt.Errorf("%w: %s refused by the fence (election key %s of revision %d gone)", ErrLeadershipLost, what, f.key, f.rev)
}

// refused is the error of a fenced write refused by etcd; resp's second
// Else response is a get of the election key, which tells a lost key
// from a record changed under a leader that still holds its own.
func (f fence) refused(what string, resp *clientv3.TxnResponse) error {
	if len(resp.Responses) > 1 {
		if kv := first(resp.Responses[1].GetResponseRange().Kvs); kv != nil && kv.CreateRevision == f.rev {
			return fmt.Errorf("%w: %s refused: the record changed under its leader", ErrLeadershipLost, what)
		}
	}
	return f.lost(what)
}

// check asks etcd whether f still holds: nil, or ErrLeadershipLost.
func (f fence) check(ctx context.Context, cli *clientv3.Client, what string) error {
	resp, err := cli.Txn(ctx).If(f.held()).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return f.lost(what)
	}
	return nil
}

// ErrLeadershipLost is returned by a coordinator whose election session
// ended or whose fenced write was refused.
var ErrLeadershipLost = errors.New("coordinator: leadership lost")

// Coordinator decides a job's generations while it is the elected leader.
type Coordinator struct {
	cli  *clientv3.Client
	keys Keys
	cfg  Config
	log  *zap.Logger
}

// New prepares a coordinator of j's job; Run campaigns and leads.
func New(j *Job, cfg Config) (*Coordinator, error) {
	if err := cfg.Rendezvous.Validate(); err != nil {
		return nil, err
	}
	if cfg.ID == "" {
		return nil, fmt.Errorf("coordinator: an id is needed to campaign")
	}
	if cfg.JoinWindow < 0 || cfg.MinWorkersTimeout < 0 || cfg.SessionTTL < 0 || cfg.ProbeTimeout < 0 {
		return nil, fmt.Errorf("coordinator: durations must not be negative")
	}
	if cfg.JoinWindow == 0 {
		cfg.JoinWindow = time.Second
	}
	if cfg.MinWorkersTimeout == 0 {
		cfg.MinWorkersTimeout = time.Minute
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 5 * time.Second
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 500 * time.Millisecond
	}
	if cfg.Probe == nil {
		cfg.Probe = func(ctx context.Context, r *phalanxpb.Registration) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", cmp.Or(r.ControlAddr, r.DataAddr))
			if err == nil {
				c.Close()
			}
			return err
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Coordinator{cli: j.cli, keys: j.keys, cfg: cfg, log: cfg.Logger.With(zap.String("coordinator", cfg.ID))}, nil
}

// Run campaigns for leadership and leads until ctx ends; a lost leadership
// sends it back to campaigning. It returns nil once the job is done (its done
// key written), ctx's error, or an error that leaves no safe decision (a
// corrupt generation record).
func (c *Coordinator) Run(ctx context.Context) error {
	for {
		err := c.lead(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrDone) {
			return nil
		}
		var ce *corruptError
		if errors.As(err, &ce) {
			return err
		}
		c.log.Warn("not leading; campaigning again", zap.Error(err))
		t := time.NewTimer(100 * time.Millisecond) // etcd unreachable: do not spin
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

type corruptError struct{ err error }

func (e *corruptError) Error() string { return e.err.Error() }
func (e *corruptError) Unwrap() error { return e.err }

// snapshot is the job's state at one revision.
type snapshot struct {
	rev     int64
	live    []*phalanxpb.Registration
	leases  map[string]clientv3.LeaseID
	cur     *phalanxpb.Generation
	genRev  int64 // mod revision of the generation record; 0 when absent
	reports []report
	done    bool
	// excluded: stragglers kept out of the ring, by id
	excluded map[string]*phalanxpb.Exclusion
	// left: the reasons of workers that left on request, by id
	left map[string]string
}

type report struct {
	key string
	msg *phalanxpb.LossReport
}

// read takes the snapshot under the fence: a deposed coordinator decides
// nothing (probes, revocations) from a read made after it lost its key.
func (c *Coordinator) read(ctx context.Context, f fence) (*snapshot, error) {
	resp, err := c.cli.Txn(ctx).If(f.held()).Then(
		clientv3.OpGet(c.keys.Workers(), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Generation()),
		clientv3.OpGet(c.keys.Reports(), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Done(), clientv3.WithCountOnly()),
		clientv3.OpGet(c.keys.Exclusions(), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Departures(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("coordinator: reading job state: %w", err)
	}
	if !resp.Succeeded {
		return nil, f.lost("reading the job")
	}
	s := &snapshot{rev: resp.Header.Revision, leases: map[string]clientv3.LeaseID{}}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		r, err := decodeRegistration(string(kv.Key), kv.Value)
		if err != nil {
			c.log.Error("ignoring a malformed registration", zap.Error(err))
			continue
		}
		s.live = append(s.live, r)
		s.leases[r.Id] = clientv3.LeaseID(kv.Lease)
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
		g, err := DecodeGeneration(string(kvs[0].Key), kvs[0].Value)
		if err != nil {
			return nil, &corruptError{err}
		}
		s.cur, s.genRev = g, kvs[0].ModRevision
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		var m phalanxpb.LossReport
		// No culprit (LostId empty) is a report too: the ring broke with
		// every member alive (calls that did not match), and is rebuilt.
		if err := proto.Unmarshal(kv.Value, &m); err != nil || m.ReporterId == "" {
			c.log.Error("dropping a malformed loss report", zap.String("key", string(kv.Key)), zap.Error(err))
			m = phalanxpb.LossReport{}
		}
		s.reports = append(s.reports, report{key: string(kv.Key), msg: &m})
	}
	s.done = resp.Responses[3].GetResponseRange().Count > 0
	s.excluded = map[string]*phalanxpb.Exclusion{}
	for _, kv := range resp.Responses[4].GetResponseRange().Kvs {
		var x phalanxpb.Exclusion
		if err := proto.Unmarshal(kv.Value, &x); err != nil || x.Id == "" || string(kv.Key) != c.keys.Exclusion(x.Id) {
			c.log.Error("ignoring a malformed exclusion", zap.String("key", string(kv.Key)), zap.Error(err))
			continue
		}
		s.excluded[x.Id] = &x
	}
	s.left = map[string]string{}
	for _, kv := range resp.Responses[5].GetResponseRange().Kvs {
		s.left[strings.TrimPrefix(string(kv.Key), c.keys.Departures())] = string(kv.Value)
	}
	return s, nil
}

// write puts next as the generation if this coordinator still leads (its
// election key keeps its revision) and the record is still the one decided
// from (fencing).
func (c *Coordinator) write(ctx context.Context, f fence, genRev int64, next *phalanxpb.Generation) error {
	if next.DecidedUnixNano == 0 { // stamped once: a retry writes the same bytes
		next.DecidedBy = c.cfg.ID
		next.DecidedUnixNano = c.cfg.Now().UnixNano()
	}
	val, err := proto.Marshal(next)
	if err != nil {
		return err
	}
	resp, err := c.cli.Txn(ctx).If(
		f.held(),
		clientv3.Compare(clientv3.ModRevision(c.keys.Generation()), "=", genRev),
	).Then(clientv3.OpPut(c.keys.Generation(), string(val))).Else(clientv3.OpGet(c.keys.Generation()), clientv3.OpGet(f.key)).Commit()
	if err != nil {
		return fmt.Errorf("coordinator: writing generation %d: %w", next.Number, err)
	}
	if !resp.Succeeded {
		if bytes.Equal(valueOf(resp), val) {
			return nil // a retry of a write whose answer was lost: it landed
		}
		return f.refused(fmt.Sprintf("generation %d", next.Number), resp)
	}
	return nil
}

// verify handles loss reports about the current generation: a reported
// worker that does not answer a probe has its registration revoked, and
// detected records how; one that answers stays, and the ring is marked broken
// so that it is rebuilt as it is. A report about an older generation naming
// a worker still in the current one, by a worker also in it, is probed too
// (the generation may have been decided, for a newcomer, before the report
// was read), but a worker that answers it does not break the newer ring;
// other old reports are dropped: a worker that is no member any more (one
// frozen past its lease, thawed) reports the ring it left, not the one
// that goes on without it.
//
// A revocation is made only after its fence is checked again (the probe
// took time), and a report is cleared under the fence: a coordinator
// deposed meanwhile leaves the reports to the one that leads.
func (c *Coordinator) verify(ctx context.Context, f fence, s *snapshot, detected map[string]string, retry func(string, func(context.Context) error) error) (broken bool, err error) {
	byID := map[string]*phalanxpb.Registration{}
	for _, r := range s.live {
		byID[r.Id] = r
	}
	remove := func(r *phalanxpb.Registration, why string) error {
		if err := retry("removing a worker", func(ctx context.Context) error {
			if err := f.check(ctx, c.cli, "removing worker "+r.Id); err != nil {
				return err
			}
			_, err := c.cli.Revoke(ctx, s.leases[r.Id])
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				return nil // gone already: expired, or revoked by a try whose answer was lost
			}
			return err
		}); err != nil {
			return fmt.Errorf("coordinator: removing worker %s: %w", r.Id, err)
		}
		detected[r.Id] = why
		delete(byID, r.Id)
		return nil
	}
	lost := false // a current member found gone
	for _, rep := range s.reports {
		current := s.cur != nil && rep.msg.Generation == s.cur.Number && !s.cur.Stopped
		member := func(id string) bool {
			return slices.ContainsFunc(s.cur.Members, func(m *phalanxpb.Member) bool { return m.Id == id })
		}
		older := s.cur != nil && rep.msg.Generation < s.cur.Number && !s.cur.Stopped &&
			member(rep.msg.LostId) && member(rep.msg.ReporterId)
		r := byID[rep.msg.LostId]
		switch {
		case !current && !older:
		case rep.msg.LostId == "":
			broken = true
		case r != nil:
			pctx, cancel := context.WithTimeout(ctx, c.cfg.ProbeTimeout)
			err := c.cfg.Probe(pctx, r)
			cancel()
			if err != nil {
				c.log.Warn("reported worker does not answer; removing it", zap.String("worker", r.Id),
					zap.String("reporter", rep.msg.ReporterId), zap.Error(err))
				if err := remove(r, fmt.Sprintf("%s reported by %s, probe failed", rep.msg.Detail, rep.msg.ReporterId)); err != nil {
					return false, err
				}
				lost = lost || current
			} else {
				c.log.Info("reported worker answers; keeping it", zap.String("worker", r.Id), zap.String("reporter", rep.msg.ReporterId))
				broken = broken || current
			}
		}
		if err := retry("clearing a report", func(ctx context.Context) error {
			resp, err := c.cli.Txn(ctx).If(f.held()).Then(clientv3.OpDelete(rep.key)).Commit()
			if err == nil && !resp.Succeeded {
				err = f.lost("clearing report " + rep.key)
			}
			return err
		}); err != nil {
			return false, fmt.Errorf("coordinator: clearing report %s: %w", rep.key, err)
		}
	}
	if lost {
		if err := c.sweep(ctx, s, byID, remove); err != nil {
			return false, err
		}
	}
	return broken, nil
}

// sweep probes, at once, every other member of the current generation
// after one was found gone: workers fail together (a host's), and a ring
// rebuilt around a dead member it was not told of waits out its join
// timeout before its next loss report. Only a definite answer removes a
// member (refused, reset, closed: its process is gone); one that does not
// answer in time (frozen, or slow) stays, as it would unreported.
func (c *Coordinator) sweep(ctx context.Context, s *snapshot, byID map[string]*phalanxpb.Registration, remove func(*phalanxpb.Registration, string) error) error {
	type result struct {
		r   *phalanxpb.Registration
		err error
	}
	var probed []*phalanxpb.Registration
	for _, m := range s.cur.Members {
		if r := byID[m.Id]; r != nil {
			probed = append(probed, r)
		}
	}
	results := make(chan result, len(probed))
	for _, r := range probed {
		go func() {
			pctx, cancel := context.WithTimeout(ctx, c.cfg.ProbeTimeout)
			defer cancel()
			results <- result{r, c.cfg.Probe(pctx, r)}
		}()
	}
	for range probed {
		res := <-results
		if res.err == nil || !gone(res.err) {
			continue
		}
		c.log.Warn("a member does not answer after another was lost; removing it", zap.String("worker", res.r.Id), zap.Error(res.err))
		if err := remove(res.r, fmt.Sprintf("gone (found with another member's loss: %v)", res.err)); err != nil {
			return err
		}
	}
	return nil
}

// gone says whether a probe's failure is definite: an answer that the
// worker's process is not there, not a wait that ran out.
func gone(err error) bool {
	var ne net.Error
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && !(errors.As(err, &ne) && ne.Timeout())
}

// ErrDone is returned by Run once the job's done key is written.
var ErrDone = errors.New("coordinator: the job is done")

func (c *Coordinator) lead(ctx context.Context) (err error) {
	sess, err := concurrency.NewSession(c.cli, concurrency.WithTTL(int(ttlSeconds(c.cfg.SessionTTL))), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("coordinator: election session: %w", err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, c.keys.Election())
	if err := el.Campaign(ctx, c.cfg.ID); err != nil {
		return fmt.Errorf("coordinator: campaign: %w", err)
	}
	f := fence{key: el.Key(), rev: el.Rev()}
	c.log.Info("leading", zap.String("election_key", f.key), zap.Int64("election_rev", f.rev))
	c.observe(Leadership{Leading: true, Key: f.key, Rev: f.rev})
	defer func() {
		// Every way out of here ends the leadership: the loop below
		// decides nothing more, and Run campaigns again.
		lvl := zap.WarnLevel
		if errors.Is(err, ErrDone) || ctx.Err() != nil {
			lvl = zap.InfoLevel
		}
		c.log.Log(lvl, "stepped down", zap.String("election_key", f.key), zap.Int64("election_rev", f.rev), zap.Error(err))
		c.observe(Leadership{Key: f.key, Rev: f.rev, Err: err})
	}()
	t := &term{c: c, f: f, ctx: ctx, lctx: sess.Ctx(), wasExcluded: map[string]bool{}, detected: map[string]string{},
		rules: rules{rendezvous: c.cfg.Rendezvous, joinWindow: c.cfg.JoinWindow, minWorkersTimeout: c.cfg.MinWorkersTimeout,
			firstRing: c.cfg.FirstRing, firstRingWait: c.cfg.FirstRingWait}}
	for {
		rev, wake, err := t.pass()
		if err != nil {
			return err
		}
		if rev == 0 {
			continue // read the job again
		}
		if err := c.wait(ctx, sess, rev, wake); err != nil {
			return err
		}
	}
}

// term is one leadership: its fence, and what its decisions carry from
// one pass to the next.
type term struct {
	c     *Coordinator
	f     fence
	ctx   context.Context // Run's
	lctx  context.Context // the election session's: its end ends the term
	rules rules
	clk   clocks
	// wasExcluded: stragglers left out in this term, to name their
	// readmission; detected: who reported each lost worker; broken: a
	// verified loss not yet decided on.
	wasExcluded map[string]bool
	detected    map[string]string
	broken      bool
}

// retry runs op under the session's context through transient etcd
// errors. Every request while leading goes through it: an election inside
// the etcd cluster fails requests for a second or two, and giving up
// leadership for it would revoke the session and hand the job to a standby
// for nothing. Leadership ends when the session does.
func (t *term) retry(what string, op func(context.Context) error) error {
	return sessionEnded(t.lctx, t.ctx, Retry(t.lctx, t.c.cfg.SessionTTL, func(err error) {
		t.c.log.Warn(what+": etcd unavailable; retrying", zap.Error(err))
	}, op))
}

// pass reads the job, verifies its loss reports or decides and writes the
// next generation or a stop. It returns the revision to wait from and how
// long to wait at most (-1: until something changes), or rev 0 to read
// again at once; ErrDone once the job is done.
func (t *term) pass() (rev int64, wake time.Duration, err error) {
	c := t.c
	var s *snapshot
	if err := t.retry("reading the job", func(ctx context.Context) (err error) {
		s, err = c.read(ctx, t.f)
		return err
	}); err != nil {
		return 0, 0, err
	}
	if s.done {
		c.log.Info("the job is done")
		return 0, 0, ErrDone
	}
	if len(s.reports) > 0 {
		b, err := c.verify(t.lctx, t.f, s, t.detected, t.retry)
		if err != nil {
			return 0, 0, err
		}
		t.broken = t.broken || b
		return 0, 0, nil // decide on what remains
	}
	now := c.cfg.Now()
	v := decideRound(t.rules, round{now: now, current: s.cur, live: s.live, excluded: s.excluded, left: s.left,
		broken: t.broken, detectedBy: t.detected, wasExcluded: t.wasExcluded, clocks: t.clk})
	t.clk = v.clocks
	if err := t.apply(s, v); err != nil {
		return 0, 0, err
	}
	if v.next != nil {
		if c.cfg.OnDecision != nil {
			c.cfg.OnDecision(v.next)
		}
		return 0, 0, nil // read the job as written
	}
	wake = -1
	if !v.wake.IsZero() {
		wake = v.wake.Sub(now)
	}
	return s.rev, wake, nil
}

// apply writes a verdict: a stop, or the next generation (whose
// exclusions and readmissions the term remembers).
func (t *term) apply(s *snapshot, v verdict) error {
	c := t.c
	write := func(ctx context.Context) error { return c.write(ctx, t.f, s.genRev, v.next) }
	switch {
	case v.stop:
		if err := t.retry("writing the stop", write); err != nil {
			return err
		}
		c.log.Error("job stopped", zap.String("reason", v.reason))
	case v.next != nil:
		for _, x := range v.next.Excluded {
			t.wasExcluded[x.Id] = true
		}
		for _, id := range v.next.Readmitted {
			delete(t.wasExcluded, id)
		}
		t.broken = false
		clear(t.detected)
		if err := t.retry("writing the generation", write); err != nil {
			return err
		}
		c.log.Info("new generation", zap.Uint64("generation", v.next.Number), zap.Int("world", len(v.next.Members)), zap.String("reason", v.reason))
	}
	return nil
}

// sessionEnded is err, or ErrLeadershipLost when err is a request's
// cut short by the end of the election session (sess's context), not of
// ctx: the leadership ended, not etcd.
func sessionEnded(sess, ctx context.Context, err error) error {
	if err != nil && sess.Err() != nil && ctx.Err() == nil && !errors.Is(err, ErrLeadershipLost) {
		return fmt.Errorf("%w: election session expired (%v)", ErrLeadershipLost, err)
	}
	return err
}

func (c *Coordinator) observe(l Leadership) {
	if c.cfg.OnLeadership != nil {
		c.cfg.OnLeadership(l)
	}
}

// wait returns when the job's keys change after rev, after wake (when not
// negative), or with an error when leadership or ctx ends.
func (c *Coordinator) wait(ctx context.Context, sess *concurrency.Session, rev int64, wake time.Duration) error {
	return waitChange(ctx, c.cli, sess, c.keys.Prefix(), rev, wake)
}

// CurrentGeneration reads the generation record (nil before the first) and
// its revision.
func (j *Job) CurrentGeneration(ctx context.Context) (*phalanxpb.Generation, int64, error) {
	resp, err := j.cli.Get(ctx, j.keys.Generation())
	if err != nil {
		return nil, 0, fmt.Errorf("coordinator: reading the generation: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, resp.Header.Revision, nil
	}
	g, err := DecodeGeneration(j.keys.Generation(), resp.Kvs[0].Value)
	return g, resp.Kvs[0].ModRevision, err
}

// ReportLoss records that reporter saw lost's connection break in generation.
func (j *Job) ReportLoss(ctx context.Context, r *phalanxpb.LossReport) error {
	val, err := proto.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := j.cli.Put(ctx, j.keys.Report(r.ReporterId, r.LostId), string(val)); err != nil {
		return fmt.Errorf("coordinator: reporting the loss of %s: %w", r.LostId, err)
	}
	return nil
}
