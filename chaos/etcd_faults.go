package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// measureBound bounds a fault's recovery measurement.
const measureBound = time.Minute

// cluster is the run's etcd service.
func cluster(env *Env) (*etcdCluster, error) {
	c, ok := env.Service("etcd").(*etcdCluster)
	if !ok || c == nil {
		return nil, errors.New("the run has no etcd cluster (job.etcd: cluster)")
	}
	return c, nil
}

// ringClient gives the runner's reads of the ring (Env.run.cli, read in
// the scheduler's goroutine, where faults are injected and healed) a
// client of the cluster without member skip (-1: of every member), when
// force says so or the runner's own client is of one comma-joined
// endpoint:
//   - ring dials the job_started event's comma-joined endpoints as one
//     endpoint, on which every read waits out its 5s timeout; swapped,
//     the run's later faults fire at their trigger. Harmless once ring
//     splits the endpoints.
//   - a read sent to a SIGSTOPped member hangs for that timeout, while
//     the job runs on: the harness's own reads avoid the member it froze
//     (forced, until it is continued).
func (c *etcdCluster) ringClient(env *Env, skip int, force bool) {
	ru := env.run
	if ru == nil {
		return
	}
	if ru.cli != nil && !force {
		if eps := ru.cli.Endpoints(); len(eps) > 1 || !strings.Contains(eps[0], ",") {
			return
		}
	}
	cli, err := coordinator.Connect(c.endpointsWithout(skip), nil, c.log)
	if err != nil {
		return
	}
	if ru.cli != nil {
		ru.cli.Close()
	}
	ru.cli = cli
}

// endpointsWithout are the client endpoints of every member but skip.
func (c *etcdCluster) endpointsWithout(skip int) []string {
	var out []string
	for i, m := range c.members {
		if i != skip {
			out = append(out, m.client)
		}
	}
	return out
}

// leader asks the reachable members which member leads: its index, or -1.
func (c *etcdCluster) leader(ctx context.Context, skip int) (int, uint64) {
	for i, m := range c.members {
		c.mu.Lock()
		usable := i != skip && m.done != nil && m.alive() && !m.stopped
		c.mu.Unlock()
		if !usable {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		st, err := c.cli.Status(sctx, m.client)
		cancel()
		if err != nil || st.Leader == 0 {
			continue
		}
		if idx, ok := c.ids[st.Leader]; ok {
			return idx, st.RaftTerm
		}
	}
	return -1, 0
}

// agreedLeader asks every usable member (alive, not stopped by a fault,
// not skip) for its status: the leader's index and the raft term when
// every one of them answers and names the same leader at the same term;
// ok is false otherwise (an election under way, a member that has not
// heard of its outcome yet, or one that does not answer). One member's
// word is not enough: a member can name a leader that the others have
// already replaced.
func (c *etcdCluster) agreedLeader(ctx context.Context, skip int) (idx int, term uint64, ok bool) {
	idx, asked := -1, 0
	for i, m := range c.members {
		c.mu.Lock()
		usable := i != skip && m.done != nil && m.alive() && !m.stopped
		c.mu.Unlock()
		if !usable {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		st, err := c.cli.Status(sctx, m.client)
		cancel()
		if err != nil || st.Leader == 0 {
			return -1, 0, false
		}
		li, known := c.ids[st.Leader]
		if !known || asked > 0 && (li != idx || st.RaftTerm != term) {
			return -1, 0, false
		}
		idx, term = li, st.RaftTerm
		asked++
	}
	return idx, term, asked > 0
}

// stableLeader waits, up to bound, until every usable member names the
// same leader at the same term twice in a row, 100 ms apart.
func (c *etcdCluster) stableLeader(ctx context.Context, skip int, bound time.Duration) (int, uint64, error) {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	prev, prevTerm := -1, uint64(0)
	for {
		idx, term, ok := c.agreedLeader(ctx, skip)
		if ok && idx == prev && term == prevTerm {
			return idx, term, nil
		}
		prev, prevTerm = idx, term
		select {
		case <-tick.C:
		case <-timer.C:
			return -1, 0, fmt.Errorf("the etcd members did not agree on a leader within %v", bound)
		case <-ctx.Done():
			return -1, 0, ctx.Err()
		}
	}
}

// target resolves a member fault's target: rank:N is member N, random a
// member drawn with the fault's pick, none the leader every member agrees
// on.
func (c *etcdCluster) target(ctx context.Context, p Planned) (idx int, leads bool, term uint64, err error) {
	var lead int
	if p.RandomRank || p.Rank >= 0 {
		lead, term = c.leader(ctx, -1)
	} else if lead, term, err = c.stableLeader(ctx, -1, 10*time.Second); err != nil {
		return 0, false, 0, err
	}
	switch {
	case p.RandomRank:
		idx = int(p.Pick % etcdMembers)
	case p.Rank >= 0:
		idx = p.Rank
	default:
		idx = lead
	}
	if idx >= len(c.members) {
		return 0, false, 0, fmt.Errorf("etcd member %d: the cluster has %d", idx, len(c.members))
	}
	m := c.members[idx]
	c.mu.Lock()
	defer c.mu.Unlock()
	if !m.alive() || m.stopped {
		return 0, false, 0, fmt.Errorf("etcd member %s (pid %d) is already down", m.name, m.pid)
	}
	return idx, idx == lead, term, nil
}

// etcdFigures is what a fault on a member measured: when another member
// led, and when a write through the cluster first succeeded.
type etcdFigures struct {
	at                 time.Time
	newLeader          int
	newLeaderAt, wrote time.Time
	err                error
}

func (f *etcdFigures) String(ttl time.Duration) string {
	var parts []string
	if !f.newLeaderAt.IsZero() {
		parts = append(parts, fmt.Sprintf("new etcd leader m%d %.2fs after", f.newLeader, f.newLeaderAt.Sub(f.at).Seconds()))
	}
	if !f.wrote.IsZero() {
		parts = append(parts, fmt.Sprintf("the cluster took a write %.2fs after", f.wrote.Sub(f.at).Seconds()))
	}
	if f.err != nil {
		parts = append(parts, "measuring: "+f.err.Error())
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "; ") + fmt.Sprintf(" (lease TTL %v)", ttl)
}

// measureMember times, from f.at, another member leading (when the one
// lost led) and the first write through the cluster.
// Once healed says so, the member lost may lead again (a stopped leader
// continued before the others elected another).
func (c *etcdCluster) measureMember(ctx context.Context, cli *clientv3.Client, lost int, led bool, healed *atomic.Bool, f *etcdFigures) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for f.newLeaderAt.IsZero() && led {
		skip := lost
		if healed.Load() {
			skip = -1
		}
		if idx, _ := c.leader(ctx, skip); idx >= 0 && (idx != lost || healed.Load()) {
			f.newLeader, f.newLeaderAt = idx, time.Now()
			break
		}
		select {
		case <-ctx.Done():
			f.err = fmt.Errorf("no other member led within %v", measureBound)
			return
		case <-tick.C:
		}
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Put(wctx, "/phalanx-chaos/probe", f.at.String())
		cancel()
		if err == nil {
			f.wrote = time.Now()
			return
		}
		select {
		case <-ctx.Done():
			f.err = fmt.Errorf("no write within %v: %w", measureBound, err)
			return
		case <-tick.C:
		}
	}
}

// measurement runs a measurement in the background, bounded by
// measureBound; wait ends it (when asked to stop) and waits for it.
type measurement struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func measure(run func(ctx context.Context)) *measurement {
	ctx, cancel := context.WithTimeout(context.Background(), measureBound)
	m := &measurement{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		defer cancel()
		run(ctx)
	}()
	return m
}

// wait waits for the measurement for up to d, then stops it.
func (m *measurement) wait(d time.Duration) {
	if m == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-m.done:
	case <-t.C:
		m.cancel()
		<-m.done
	}
}

// memberFault SIGKILLs (or SIGSTOPs) an etcd member. Heal: a stopped
// member is continued; a killed one is restarted on its data when the
// fault has a duration, and otherwise stays dead (two of three keep the
// quorum).
type memberFault struct {
	p    Planned
	stop bool
	c    *etcdCluster
	idx  int
	led  bool
	pid  int
	fig  etcdFigures
	meas *measurement
	// healed tells the measurement that the member is back.
	healed atomic.Bool
}

func (f *memberFault) Inject(ctx context.Context, env *Env) (string, error) {
	c, err := cluster(env)
	if err != nil {
		return "", err
	}
	c.ringClient(env, -1, false)
	idx, led, term, err := c.target(ctx, f.p)
	if err != nil {
		return "", err
	}
	f.c = c
	m := c.members[idx]
	sig := syscall.SIGKILL
	if f.stop {
		sig = syscall.SIGSTOP
	}
	c.mu.Lock()
	f.idx, f.led, f.pid = idx, led, m.pid
	if err := syscall.Kill(m.pid, sig); err != nil {
		c.mu.Unlock()
		return "", fmt.Errorf("%s to etcd member %s (pid %d): %w", signalName(sig), m.name, m.pid, err)
	}
	m.stopped, m.killed = f.stop, !f.stop
	c.mu.Unlock()
	if f.stop {
		if err := awaitStopped(f.pid, 5*time.Second); err != nil {
			return "", fmt.Errorf("SIGSTOP to etcd member %s: %w", m.name, err)
		}
	}
	f.fig = etcdFigures{at: time.Now()}
	// The measurement's writes, and the runner's reads, go to the others.
	cli, err := coordinator.Connect(c.endpointsWithout(idx), nil, c.log)
	if err != nil {
		return "", err
	}
	if f.stop {
		c.ringClient(env, idx, true)
	}
	f.meas = measure(func(ctx context.Context) {
		defer cli.Close()
		c.measureMember(ctx, cli, idx, led, &f.healed, &f.fig)
	})
	role := "a follower"
	if led {
		role = fmt.Sprintf("the leader, term %d", term)
	}
	return fmt.Sprintf("%s to etcd member %s (pid %d, %s)", signalName(sig), m.name, m.pid, role), nil
}

func (f *memberFault) Heal(ctx context.Context, env *Env) (string, error) {
	if f.c == nil {
		return "", nil
	}
	c, m := f.c, f.c.members[f.idx]
	var did string
	switch {
	case f.stop:
		c.mu.Lock()
		err := syscall.Kill(f.pid, syscall.SIGCONT)
		m.stopped = false
		c.mu.Unlock()
		if err != nil {
			return "", fmt.Errorf("SIGCONT to etcd member %s (pid %d): %w", m.name, f.pid, err)
		}
		did = fmt.Sprintf("SIGCONT to etcd member %s (pid %d)", m.name, f.pid)
		c.ringClient(env, -1, true) // every member again
	case f.p.Duration > 0:
		<-m.done // reaped: its ports are free again
		if err := c.startMember(ctx, m); err != nil {
			return "", fmt.Errorf("restarting etcd member %s: %w", m.name, err)
		}
		did = fmt.Sprintf("etcd member %s restarted on its data (pid %d)", m.name, m.pid)
	default:
		did = fmt.Sprintf("etcd member %s stays dead: two of three members keep the quorum", m.name)
	}
	f.healed.Store(true)
	f.meas.wait(measureBound)
	if fig := f.fig.String(c.leaseTTL()); fig != "" {
		did += "; " + fig
	}
	return did, nil
}

func (c *etcdCluster) leaseTTL() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ttl
}

// coordFigures is what a coordinator leader's kill measured: when a
// standby led, and when it decided a generation.
type coordFigures struct {
	at        time.Time
	killed    string
	tookOver  time.Time
	newLeader string
	decided   time.Time
	gen       uint64
	reason    string
	done      bool // the job ended first
	err       error
}

func (f *coordFigures) String(ttl time.Duration) string {
	var parts []string
	if !f.tookOver.IsZero() {
		parts = append(parts, fmt.Sprintf("standby %s led %.2fs after the kill", f.newLeader, f.tookOver.Sub(f.at).Seconds()))
	} else {
		parts = append(parts, "no standby led")
	}
	switch {
	case !f.decided.IsZero():
		parts = append(parts, fmt.Sprintf("decided generation %d (%s) %.2fs after the kill", f.gen, f.reason, f.decided.Sub(f.at).Seconds()))
	case f.done:
		parts = append(parts, "the job ended with no new generation to decide")
	}
	if f.err != nil {
		parts = append(parts, "measuring: "+f.err.Error())
	}
	return strings.Join(parts, "; ") + fmt.Sprintf(" (lease TTL %v)", ttl)
}

// electionLeader is the id of the job's elected coordinator ("" : none):
// the election key created first.
func electionLeader(ctx context.Context, coord *coordinator.Job) (string, error) {
	kvs, err := electionKeys(ctx, coord)
	if err != nil || len(kvs) == 0 {
		return "", err
	}
	return string(kvs[0].Value), nil
}

// electionKeys are the job's coordinators' campaign keys, oldest first:
// the first leads, the others wait behind it in turn.
func electionKeys(ctx context.Context, coord *coordinator.Job) ([]*mvccpb.KeyValue, error) {
	resp, err := coord.Client().Get(ctx, coord.Keys().Election()+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	return resp.Kvs, nil
}

// measureTakeover watches the job's keys from the kill on: a standby
// leading, then a generation it decided.
func (c *etcdCluster) measureTakeover(ctx context.Context, coord *coordinator.Job, f *coordFigures) {
	w := coord.Client().Watch(clientv3.WithRequireLeader(ctx), coord.Keys().Prefix(), clientv3.WithPrefix())
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lead, err := electionLeader(rctx, coord)
		g, _, gerr := coord.CurrentGeneration(rctx)
		done, derr := coord.Client().Get(rctx, coord.Keys().Done(), clientv3.WithCountOnly())
		cancel()
		now := time.Now()
		if err == nil && lead != "" && lead != f.killed && f.tookOver.IsZero() {
			f.newLeader, f.tookOver = lead, now
		}
		if gerr == nil && g != nil && g.DecidedBy != f.killed && g.DecidedUnixNano > f.at.UnixNano() {
			f.gen, f.reason, f.decided = g.Number, g.Reason, time.Unix(0, g.DecidedUnixNano)
			if f.tookOver.IsZero() {
				f.newLeader, f.tookOver = g.DecidedBy, now
			}
			return
		}
		if derr == nil && done.Count > 0 {
			f.done = true
			return
		}
		select {
		case <-ctx.Done():
			f.err = fmt.Errorf("gave up after %v", measureBound)
			return
		case _, ok := <-w:
			if !ok {
				f.err = errors.New("the watch ended")
				return
			}
		}
	}
}

// coordinatorKill SIGKILLs the job's elected coordinator; a standby must
// take over within the lease TTL and decide the job's next generations.
type coordinatorKill struct {
	c    *etcdCluster
	fig  coordFigures
	meas *measurement
}

// elected is the job's coordinator election as a fault finds it: the
// campaign keys (the first leads), the leader's process, and the current
// generation (nil when it could not be read).
type elected struct {
	c     *etcdCluster
	coord *coordinator.Job // through the cluster's client
	kvs   []*mvccpb.KeyValue
	id    string
	p     *serviceProc
	gen   *phalanxpb.Generation
}

// leadingCoordinator finds the coordinator process that leads the job's
// election.
func leadingCoordinator(ctx context.Context, env *Env) (*elected, error) {
	c, err := cluster(env)
	if err != nil {
		return nil, err
	}
	c.ringClient(env, -1, false)
	keys, err := coordinator.KeysFor(env.run.job)
	if err != nil {
		return nil, err
	}
	coord := coordinator.NewJob(c.cli, keys)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	kvs, err := electionKeys(rctx, coord)
	g, _, _ := coord.CurrentGeneration(rctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("reading the coordinator election: %w", err)
	}
	if len(kvs) == 0 {
		return nil, errors.New("no coordinator leads the job's election")
	}
	e := &elected{c: c, coord: coord, kvs: kvs, id: string(kvs[0].Value), gen: g}
	if e.p = c.coordinator(e.id); e.p == nil {
		return nil, fmt.Errorf("no coordinator process of the job is %q, the election's leader", e.id)
	}
	return e, nil
}

// decided names the generation the election's leader last decided, for
// evidence.
func (e *elected) decided() string {
	if e.gen == nil {
		return ""
	}
	return fmt.Sprintf(", generation %d decided by %s", e.gen.Number, e.gen.DecidedBy)
}

func (f *coordinatorKill) Inject(ctx context.Context, env *Env) (string, error) {
	e, err := leadingCoordinator(ctx, env)
	if err != nil {
		return "", err
	}
	c, coord, id, p := e.c, e.coord, e.id, e.p
	c.mu.Lock()
	pid := p.pid
	err = syscall.Kill(pid, syscall.SIGKILL)
	p.killed = err == nil
	c.mu.Unlock()
	if err != nil {
		return "", fmt.Errorf("SIGKILL to coordinator %s (pid %d): %w", id, pid, err)
	}
	f.c, f.fig = c, coordFigures{at: time.Now(), killed: id}
	f.meas = measure(func(ctx context.Context) { c.measureTakeover(ctx, coord, &f.fig) })
	return fmt.Sprintf("SIGKILL to coordinator %s (pid %d), the election's leader%s", id, pid, e.decided()), nil
}

func (f *coordinatorKill) Heal(context.Context, *Env) (string, error) {
	if f.c == nil {
		return "", nil
	}
	f.meas.wait(measureBound)
	return fmt.Sprintf("coordinator %s stays dead; %s", f.fig.killed, f.fig.String(f.c.leaseTTL())), nil
}

// coordinatorPause SIGSTOPs the job's elected coordinator, so that its
// session's lease expires and a standby takes over; Heal, once a standby
// leads (no earlier than the fault's duration), SIGCONTs it and checks
// that it stepped down: its log says so and why (its requests refused by
// the fence, or its session found expired), it campaigns again behind
// the new leader, and no generation written since the SIGCONT is its.
type coordinatorPause struct {
	c     *etcdCluster
	coord *coordinator.Job // through the cluster's client
	p     *serviceProc
	id    string
	pid   int
	log   string // its log file
	key   string // its election key...
	rev   int64  // ...and that key's create revision
	at    time.Time
}

func (f *coordinatorPause) Inject(ctx context.Context, env *Env) (string, error) {
	e, err := leadingCoordinator(ctx, env)
	if err != nil {
		return "", err
	}
	c, coord, kvs, id, p := e.c, e.coord, e.kvs, e.id, e.p
	if len(kvs) < 2 {
		return "", fmt.Errorf("coordinator %s leads with no standby behind it", id)
	}
	c.mu.Lock()
	pid, job := p.pid, c.job
	err = syscall.Kill(pid, syscall.SIGSTOP)
	p.stopped = err == nil
	c.mu.Unlock()
	if err == nil {
		err = awaitStopped(pid, 5*time.Second)
	}
	if err != nil {
		return "", fmt.Errorf("SIGSTOP to coordinator %s (pid %d): %w", id, pid, err)
	}
	*f = coordinatorPause{c: c, coord: coord, p: p, id: id, pid: pid, log: c.logPath(job + "-" + id),
		key: string(kvs[0].Key), rev: kvs[0].CreateRevision, at: time.Now()}
	return fmt.Sprintf("SIGSTOP to coordinator %s (pid %d), the election's leader (its key of revision %d)%s", id, pid, f.rev, e.decided()), nil
}

func (f *coordinatorPause) Heal(ctx context.Context, env *Env) (string, error) {
	if f.c == nil {
		return "", nil
	}
	c := f.c
	bctx, cancel := context.WithTimeout(ctx, measureBound)
	defer cancel()
	standby, tookOver, terr := f.takeover(bctx)
	// Continued whatever happened: a stopped process must not outlive the fault.
	var offset int64
	if st, err := os.Stat(f.log); err == nil {
		offset = st.Size()
	}
	rctx, rcancel := context.WithTimeout(bctx, 5*time.Second)
	before, rerr := f.coord.Client().Get(rctx, f.coord.Keys().Generation())
	rcancel()
	c.mu.Lock()
	err := syscall.Kill(f.pid, syscall.SIGCONT)
	f.p.stopped = false
	c.mu.Unlock()
	cont := time.Now()
	switch {
	case err != nil:
		return "", fmt.Errorf("SIGCONT to coordinator %s (pid %d): %w", f.id, f.pid, err)
	case terr != nil:
		return "", fmt.Errorf("SIGCONT to coordinator %s (pid %d) with no standby leading: %w", f.id, f.pid, terr)
	case rerr != nil:
		return "", fmt.Errorf("reading the generation before the SIGCONT: %w", rerr)
	}
	did := fmt.Sprintf("SIGCONT to coordinator %s (pid %d) once standby %s led, %.2fs after the SIGSTOP (lease TTL %v)",
		f.id, f.pid, standby, tookOver.Sub(f.at).Seconds(), c.leaseTTL())
	why, down, err := f.steppedDown(bctx, offset, standby)
	if err != nil {
		return "", fmt.Errorf("%s; %w", did, err)
	}
	did += fmt.Sprintf("; %s stepped down %.2fs after the SIGCONT (%s) and campaigns again behind %s", f.id, down.Sub(cont).Seconds(), why, standby)
	written, err := f.writtenSince(bctx, before.Header.Revision)
	if err != nil {
		return "", fmt.Errorf("%s; %w", did, err)
	}
	var others []string
	for _, g := range written {
		if g.DecidedBy == f.id {
			return "", fmt.Errorf("%s; but it wrote generation %d after the SIGCONT: the fence let a deposed coordinator write", did, g.Number)
		}
		others = append(others, fmt.Sprintf("%d by %s", g.Number, g.DecidedBy))
	}
	did += "; no generation written by it after the SIGCONT"
	if len(others) > 0 {
		did += " (generations since: " + strings.Join(others, ", ") + ")"
	}
	return did, nil
}

// takeover waits until another coordinator leads the election: the
// paused one's key went with its lease.
func (f *coordinatorPause) takeover(ctx context.Context) (string, time.Time, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		kvs, err := electionKeys(rctx, f.coord)
		cancel()
		if err == nil && len(kvs) > 0 && string(kvs[0].Key) != f.key && string(kvs[0].Value) != f.id {
			return string(kvs[0].Value), time.Now(), nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return "", time.Time{}, fmt.Errorf("no standby led within %v of the SIGSTOP", measureBound)
		}
	}
}

// steppedDown waits until the continued coordinator has logged (after
// offset) that it stepped down, and campaigns again behind standby: it
// returns the reason it logged and when both were seen.
func (f *coordinatorPause) steppedDown(ctx context.Context, offset int64, standby string) (string, time.Time, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	why := ""
	behind := false
	for {
		if why == "" {
			why = loggedStepDown(f.log, offset)
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		kvs, err := electionKeys(rctx, f.coord)
		cancel()
		if err == nil && len(kvs) > 1 && string(kvs[0].Value) == standby {
			for _, kv := range kvs[1:] {
				behind = behind || string(kv.Value) == f.id && kv.CreateRevision > f.rev
			}
		}
		if why != "" && behind {
			return why, time.Now(), nil
		}
		select {
		case <-tick.C:
		case <-f.p.done:
			return "", time.Time{}, fmt.Errorf("coordinator %s exited after the SIGCONT (%v) before it was seen to step down (logged %q, campaigning again: %v)",
				f.id, f.p.cmd.ProcessState, why, behind)
		case <-ctx.Done():
			return "", time.Time{}, fmt.Errorf("coordinator %s not seen to step down within %v of the SIGSTOP (logged %q, campaigning again behind %s: %v)",
				f.id, measureBound, why, standby, behind)
		}
	}
}

// loggedStepDown is the error of the first "stepped down" line of a
// coordinator's JSON log after offset ("" : none yet).
func loggedStepDown(path string, offset int64) string {
	fh, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer fh.Close()
	if _, err := fh.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg   string `json:"msg"`
			Error string `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "stepped down" {
			return line.Error
		}
	}
	return ""
}

// writtenSince reads back, from etcd's history, every generation record
// written after revision rev, newest first.
func (f *coordinatorPause) writtenSince(ctx context.Context, rev int64) ([]*phalanxpb.Generation, error) {
	var out []*phalanxpb.Generation
	var opts []clientv3.OpOption
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := f.coord.Client().Get(rctx, f.coord.Keys().Generation(), opts...)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("reading the generations written since the SIGCONT: %w", err)
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].ModRevision <= rev {
			return out, nil
		}
		g, err := coordinator.DecodeGeneration(f.coord.Keys().Generation(), resp.Kvs[0].Value)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
		opts = []clientv3.OpOption{clientv3.WithRev(resp.Kvs[0].ModRevision - 1)}
	}
}
