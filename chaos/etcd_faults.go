package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/coordinator"
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
	cli, err := coordinator.Connect(c.endpointsWithout(skip), c.log)
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

// target resolves a member fault's target: rank:N is member N, random a
// member drawn with the fault's pick, none the current leader.
func (c *etcdCluster) target(ctx context.Context, p Planned) (idx int, leads bool, term uint64, err error) {
	lead, term := c.leader(ctx, -1)
	switch {
	case p.RandomRank:
		idx = int(p.Pick % etcdMembers)
	case p.Rank >= 0:
		idx = p.Rank
	default:
		if lead < 0 {
			return 0, false, 0, errors.New("no etcd member reports a leader")
		}
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
	f.fig = etcdFigures{at: time.Now()}
	// The measurement's writes, and the runner's reads, go to the others.
	cli, err := coordinator.Connect(c.endpointsWithout(idx), c.log)
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
func electionLeader(ctx context.Context, cli *clientv3.Client, keys coordinator.Keys) (string, error) {
	resp, err := cli.Get(ctx, keys.Election()+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// measureTakeover watches the job's keys from the kill on: a standby
// leading, then a generation it decided.
func (c *etcdCluster) measureTakeover(ctx context.Context, keys coordinator.Keys, f *coordFigures) {
	w := c.cli.Watch(clientv3.WithRequireLeader(ctx), keys.Prefix(), clientv3.WithPrefix())
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		lead, err := electionLeader(rctx, c.cli, keys)
		g, _, gerr := coordinator.CurrentGeneration(rctx, c.cli, keys)
		done, derr := c.cli.Get(rctx, keys.Done(), clientv3.WithCountOnly())
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

func (f *coordinatorKill) Inject(ctx context.Context, env *Env) (string, error) {
	c, err := cluster(env)
	if err != nil {
		return "", err
	}
	c.ringClient(env, -1, false)
	keys, err := coordinator.KeysFor(env.run.job)
	if err != nil {
		return "", err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	id, err := electionLeader(rctx, c.cli, keys)
	g, _, _ := coordinator.CurrentGeneration(rctx, c.cli, keys)
	cancel()
	if err != nil {
		return "", fmt.Errorf("reading the coordinator election: %w", err)
	}
	p := c.coordinator(id)
	if id == "" || p == nil {
		return "", fmt.Errorf("no coordinator process leads the job's election (leader %q)", id)
	}
	c.mu.Lock()
	pid := p.pid
	err = syscall.Kill(pid, syscall.SIGKILL)
	p.killed = err == nil
	c.mu.Unlock()
	if err != nil {
		return "", fmt.Errorf("SIGKILL to coordinator %s (pid %d): %w", id, pid, err)
	}
	f.c, f.fig = c, coordFigures{at: time.Now(), killed: id}
	f.meas = measure(func(ctx context.Context) { c.measureTakeover(ctx, keys, &f.fig) })
	decided := ""
	if g != nil {
		decided = fmt.Sprintf(", generation %d decided by %s", g.Number, g.DecidedBy)
	}
	return fmt.Sprintf("SIGKILL to coordinator %s (pid %d), the election's leader%s", id, pid, decided), nil
}

func (f *coordinatorKill) Heal(context.Context, *Env) (string, error) {
	if f.c == nil {
		return "", nil
	}
	f.meas.wait(measureBound)
	return fmt.Sprintf("coordinator %s stays dead; %s", f.fig.killed, f.fig.String(f.c.leaseTTL())), nil
}
