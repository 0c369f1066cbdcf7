package chaos

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// TestEtcdScenarios runs the etcd and coordinator scenarios against real
// jobs on a real 3-member etcd cluster (three OS processes) with two
// coordinator processes: every invariant holds, each fault's evidence
// names the member or coordinator it hit, and its heal's evidence the
// recovery (another leader, a write taken, a generation the standby
// decided).
func TestEtcdScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("real jobs and an etcd cluster: not in -short")
	}
	r := &Runner{Registry: examples.Registry(), Dir: jobtest.KeptDir(t)}
	for _, tc := range []struct {
		name string
		// what the etcd fault's evidence and heal must say
		what, heal *regexp.Regexp
	}{
		{"etcd-leader-kill", regexp.MustCompile(`^SIGKILL to etcd member m\d \(pid \d+, the leader, term \d+\)$`),
			regexp.MustCompile(`stays dead.*new etcd leader m\d [0-9.]+s after; the cluster took a write [0-9.]+s after`)},
		{"etcd-pause", regexp.MustCompile(`^SIGSTOP to etcd member m\d \(pid \d+, the leader, term \d+\)$`),
			regexp.MustCompile(`^SIGCONT to etcd member m\d \(pid \d+\); .*the cluster took a write [0-9.]+s after`)},
		{"etcd-pause-at-join", regexp.MustCompile(`^SIGSTOP to etcd member m\d \(pid \d+, the leader, term \d+\)$`),
			regexp.MustCompile(`^SIGCONT to etcd member m\d \(pid \d+\); .*the cluster took a write [0-9.]+s after`)},
		{"coordinator-failover", regexp.MustCompile(`^SIGKILL to coordinator coordinator-\d \(pid \d+\), the election's leader, generation \d+ decided by coordinator-\d$`),
			regexp.MustCompile(`standby coordinator-\d led [0-9.]+s after the kill; decided generation \d+ \(.*\) [0-9.]+s after the kill`)},
		{"coordinator-pause", regexp.MustCompile(`^SIGSTOP to coordinator coordinator-\d \(pid \d+\), the election's leader \(its key of revision \d+\), generation \d+ decided by coordinator-\d$`),
			regexp.MustCompile(`^SIGCONT to coordinator coordinator-\d \(pid \d+\) once standby coordinator-\d led, [0-9.]+s after the SIGSTOP \(lease TTL 5s\); ` +
				`coordinator-\d stepped down [0-9.]+s after the SIGCONT \(coordinator: leadership lost: .*\) and campaigns again behind coordinator-\d; no generation written by it after the SIGCONT`)},
		{"etcd-member-restart", regexp.MustCompile(`^SIGKILL to etcd member m1 \(pid \d+, (the leader, term \d+|a follower)\)$`),
			regexp.MustCompile(`^etcd member m1 restarted on its data \(pid \d+\); .*the cluster took a write [0-9.]+s after`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := Lookup(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			rep := runAndCheck(t, r, sc, 1)
			f := rep.Faults[0]
			t.Logf("fault 0: %s; healed: %s", f.What, f.HealWhat)
			if !tc.what.MatchString(f.What) {
				t.Errorf("fault 0's evidence %q does not match %v", f.What, tc.what)
			}
			if !tc.heal.MatchString(f.HealWhat) {
				t.Errorf("fault 0's heal %q does not match %v", f.HealWhat, tc.heal)
			}
			if tc.name == "coordinator-failover" {
				killed := regexp.MustCompile(`coordinator (coordinator-\d) \(pid`).FindStringSubmatch(f.What)
				if killed == nil || strings.Contains(f.HealWhat, "standby "+killed[1]+" ") {
					t.Errorf("the standby that took over is the one killed: %q, %q", f.What, f.HealWhat)
				}
			}
			if tc.name == "coordinator-pause" {
				checkDeposed(t, rep, f)
			}
			if tc.name == "etcd-pause-at-join" {
				// The workers registered during the pause, before any step,
				// and one coordinator decided every generation: it did not
				// resign over the election's failed requests.
				if f.AtStep != 0 || len(rep.Steps) == 0 || rep.Steps[0].T < f.Injected.Sub(rep.Started).Seconds() {
					t.Errorf("the pause came at step %d, not at the launch before the first step", f.AtStep)
				}
				deciders := map[string]bool{}
				for _, g := range rep.Generations {
					deciders[g.DecidedBy] = true
				}
				if len(deciders) != 1 || len(rep.Generations) < 2 {
					t.Errorf("generations %+v: want at least two, all decided by one coordinator", rep.Generations)
				}
			}
			for _, g := range EtcdRecovery(rep) {
				t.Log(g)
			}
			if !rep.Passed {
				t.Errorf("the run failed; kept in %s", rep.Dir)
			}
		})
	}
}

// checkDeposed: the coordinator paused is the one continued, which
// stepped down behind the standby that took over; the standby is not the
// one paused; and every generation decided after the pause (the worker's
// kill makes one, before or after the heal) is the new leader's, none the
// paused one's.
func checkDeposed(t *testing.T, rep *Report, f *FaultRecord) {
	t.Helper()
	paused := regexp.MustCompile(`^SIGSTOP to coordinator (coordinator-\d) \(pid (\d+)\)`).FindStringSubmatch(f.What)
	healed := regexp.MustCompile(`^SIGCONT to coordinator (coordinator-\d) \(pid (\d+)\) once standby (coordinator-\d) led.*; (coordinator-\d) stepped down .* campaigns again behind (coordinator-\d);`).FindStringSubmatch(f.HealWhat)
	if paused == nil || healed == nil {
		t.Fatalf("the fault's evidence does not name the coordinators: %q, %q", f.What, f.HealWhat)
	}
	id, pid, standby := paused[1], paused[2], healed[3]
	if healed[1] != id || healed[2] != pid || healed[4] != id || healed[5] != standby || standby == id {
		t.Errorf("paused %s (pid %s); continued %s (pid %s), stepped down %s behind %s, standby %s: want the paused one continued and stepped down behind another",
			id, pid, healed[1], healed[2], healed[4], healed[5], standby)
	}
	pausedAt := f.Injected.Sub(rep.Started).Seconds()
	after := 0
	for _, g := range rep.Generations {
		if g.T < pausedAt || g.DecidedBy == "" {
			continue
		}
		after++
		if g.DecidedBy != standby {
			t.Errorf("generation %d (%s), %.2fs into the run, after the pause at %.2fs, decided by %s, not by the new leader %s", g.Generation, g.Reason, g.T, pausedAt, g.DecidedBy, standby)
		}
	}
	if after == 0 {
		t.Errorf("no generation after the pause at %.2fs (the worker's kill should make one): %+v", pausedAt, rep.Generations)
	}
}

// TestEtcdKindsNeedTheCluster: the etcd kinds are refused on a job without
// job.etcd cluster, and a cluster job names its coordinators' count.
func TestEtcdKindsNeedTheCluster(t *testing.T) {
	for _, k := range []string{"etcd-kill", "etcd-pause", "coordinator-leader-kill", "coordinator-leader-pause"} {
		s := Scenario{Name: "x", Job: smallJob(3, 0), Faults: []FaultSpec{{Kind: k, Trigger: Trigger{Step: 5}, Duration: Duration(time.Second)}}}
		if err := s.Validate(DefaultKinds()); err == nil || !strings.Contains(err.Error(), "etcd: cluster") {
			t.Errorf("%s on an embedded etcd: %v, want a refusal naming job.etcd: cluster", k, err)
		}
		s.Job.Etcd = "cluster"
		if err := s.Validate(DefaultKinds()); err != nil {
			t.Errorf("%s on a cluster: %v", k, err)
		}
	}
	for _, tc := range []struct {
		n       int
		wantErr bool
	}{{0, false}, {1, false}, {3, false}, {-1, true}, {9, true}} {
		sc := &Scenario{Name: fmt.Sprint("c", tc.n), Job: clusterJob(3)}
		sc.Job.Coordinators = tc.n
		s, err := etcdService(sc)
		if (err != nil) != tc.wantErr || (err == nil && s == nil) {
			t.Errorf("coordinators %d: %v, %v", tc.n, s, err)
		}
	}
	if s, err := etcdService(&Scenario{Job: smallJob(3, 0)}); s != nil || err != nil {
		t.Errorf("an embedded etcd job got the cluster service: %v, %v", s, err)
	}
}

// TestRetryThroughEtcdLeaderPause: a request sent to a follower just after
// the etcd leader froze is forwarded to the frozen leader and times out —
// the failure a worker joining during an etcd election met. The join's
// configuration claim (retried by its caller) and the idempotent writes
// the coordinator package retries itself each meet it (an attempt fails,
// seen at the client) and outlive it (the record, read back, holds what
// was written).
//
// The member frozen is the leader every member names at the same term,
// and still the one the others name once it is frozen; should leadership
// move before the freeze or before the request reaches the frozen leader
// (a busy machine), the precondition is made again: thaw, wait for a
// stable leader, freeze it, a few times at most.
func TestRetryThroughEtcdLeaderPause(t *testing.T) {
	if testing.Short() {
		t.Skip("a real etcd cluster: not in -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sc := &Scenario{Name: "retry", Job: clusterJob(3)}
	sc.Job.Coordinators = 0
	svc, err := etcdService(sc)
	if err != nil {
		t.Fatal(err)
	}
	c := svc.(*etcdCluster)
	if err := c.Start(ctx, t.TempDir(), zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func(ctx context.Context, cli *clientv3.Client, key string) (string, bool, error) {
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			return "", false, err
		}
		return string(resp.Kvs[0].Value), true, nil
	}
	wantValue := func(key, want string) func(context.Context, *clientv3.Client) error {
		return func(ctx context.Context, cli *clientv3.Client) error {
			v, ok, err := get(ctx, cli, key)
			if err != nil || !ok || v != want {
				return fmt.Errorf("%s holds %q (present %v, %v), want %q", key, v, ok, err, want)
			}
			return nil
		}
	}
	straggler := &phalanxpb.Exclusion{Id: "w2", LateIn: 6, Window: 8}
	for _, tc := range []struct {
		name string
		// setup, through the whole cluster before the freeze
		setup func(ctx context.Context, j *coordinator.Job) error
		op    func(ctx context.Context, j *coordinator.Job) error
		// landed reads the record back through the follower
		landed func(keys coordinator.Keys) func(context.Context, *clientv3.Client) error
	}{
		{"claim the configuration", nil,
			func(ctx context.Context, j *coordinator.Job) error {
				var recorded string
				err := coordinator.Retry(ctx, time.Minute, nil, func(ctx context.Context) (err error) {
					recorded, err = j.ClaimConfig(ctx, "hash-1")
					return err
				})
				if err == nil && recorded != "hash-1" {
					err = fmt.Errorf("recorded %q", recorded)
				}
				return err
			},
			func(keys coordinator.Keys) func(context.Context, *clientv3.Client) error {
				return wantValue(keys.Config(), "hash-1")
			}},
		{"leave", nil,
			func(ctx context.Context, j *coordinator.Job) error {
				return j.Leave(ctx, "w1", "scaled down")
			},
			func(keys coordinator.Keys) func(context.Context, *clientv3.Client) error {
				return wantValue(keys.Departure("w1"), "scaled down")
			}},
		{"request a stop", nil,
			func(ctx context.Context, j *coordinator.Job) error {
				return j.RequestStop(ctx, "operator")
			},
			func(keys coordinator.Keys) func(context.Context, *clientv3.Client) error {
				return wantValue(keys.Stop(), "operator")
			}},
		{"exclude a straggler", nil,
			func(ctx context.Context, j *coordinator.Job) error {
				return j.Exclude(ctx, straggler)
			},
			func(keys coordinator.Keys) func(context.Context, *clientv3.Client) error {
				return func(ctx context.Context, cli *clientv3.Client) error {
					v, ok, err := get(ctx, cli, keys.Exclusion("w2"))
					var x phalanxpb.Exclusion
					if err != nil || !ok || proto.Unmarshal([]byte(v), &x) != nil || !proto.Equal(&x, straggler) {
						return fmt.Errorf("%s holds %v (present %v, %v), want %v", keys.Exclusion("w2"), &x, ok, err, straggler)
					}
					return nil
				}
			}},
		{"readmit it",
			func(ctx context.Context, j *coordinator.Job) error {
				if err := j.Exclude(ctx, straggler); err != nil {
					return err
				}
				if _, ok, err := get(ctx, j.Client(), j.Keys().Exclusion("w2")); err != nil || !ok {
					return fmt.Errorf("the exclusion to lift is not there: %v", err)
				}
				return nil
			},
			func(ctx context.Context, j *coordinator.Job) error {
				return j.Readmit(ctx, "w2")
			},
			func(keys coordinator.Keys) func(context.Context, *clientv3.Client) error {
				return func(ctx context.Context, cli *clientv3.Client) error {
					if v, ok, err := get(ctx, cli, keys.Exclusion("w2")); err != nil || ok {
						return fmt.Errorf("%s still holds %q (%v): the readmission did not land", keys.Exclusion("w2"), v, err)
					}
					return nil
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const attempts = 5
			for attempt := 1; ; attempt++ {
				// Fresh records each attempt: what is read back is this attempt's.
				keys, err := coordinator.KeysFor(fmt.Sprintf("retry-%d-%d", attempt, time.Now().UnixNano()))
				if err != nil {
					t.Fatal(err)
				}
				moved := throughFrozenLeader(t, ctx, c, keys, tc.setup, tc.op, tc.landed(keys))
				if moved == "" {
					return
				}
				if attempt == attempts {
					t.Fatalf("%d attempts, and each time the etcd leadership moved before the request met the frozen leader; last: %s", attempts, moved)
				}
				t.Logf("attempt %d: %s; again", attempt, moved)
			}
		})
	}
}

// throughFrozenLeader freezes the leader every member agrees on, sends op
// through a follower, and checks that op met the frozen leader (an attempt
// failed with a transient error), outlived it, and landed. It returns why
// the precondition did not hold ("" when it held and the checks were
// made): the leadership moved before the freeze took effect, or before op
// reached the frozen leader.
func throughFrozenLeader(t *testing.T, ctx context.Context, c *etcdCluster, keys coordinator.Keys,
	setup, op func(context.Context, *coordinator.Job) error, landed func(context.Context, *clientv3.Client) error) (moved string) {
	t.Helper()
	if setup != nil {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := setup(sctx, coordinator.NewJob(c.cli, keys))
		cancel()
		if err != nil {
			t.Fatalf("setting up: %v", err)
		}
	}
	lead, term, err := c.stableLeader(ctx, -1, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	frozen := lead
	m, follower := c.members[frozen], c.members[(frozen+1)%len(c.members)]
	var mu sync.Mutex
	var failures []error
	// Every attempt the client makes, the etcd client's own retries
	// included, passes here: a failure is the request meeting the fault.
	seen := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil {
			mu.Lock()
			failures = append(failures, fmt.Errorf("%s: %w", method, err))
			mu.Unlock()
		}
		return err
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{follower.client}, DialTimeout: 5 * time.Second, DialOptions: []grpc.DialOption{seen}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	c.mu.Lock()
	err = syscall.Kill(m.pid, syscall.SIGSTOP)
	m.stopped = err == nil
	c.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	thaw := func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if m.stopped {
			syscall.Kill(m.pid, syscall.SIGCONT)
			m.stopped = false
		}
	}
	defer thaw()
	// kill(2) returns before the stop has taken hold of every thread; a
	// leader still running a moment later commits the request (seen: "the
	// request succeeded at once ... while m0, frozen, still leads").
	if err := awaitStopped(m.pid, 5*time.Second); err != nil {
		t.Fatalf("etcd member %s: %v", m.name, err)
	}
	// The others still name it, at the same term: it led when it froze.
	switch idx, t2, ok := c.agreedLeader(ctx, frozen); {
	case !ok || t2 != term:
		return fmt.Sprintf("member %s, leader at term %d, frozen; the others then named member %d at term %d (agreed: %v)", m.name, term, idx, t2, ok)
	case idx != frozen:
		t.Fatalf("froze %s, not the leader: the others name member %d at term %d, the term before the freeze", m.name, idx, term)
	}
	octx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := op(octx, coordinator.NewJob(cli, keys)); err != nil {
		t.Fatalf("through follower %s with leader %s frozen at term %d: %v", follower.name, m.name, term, err)
	}
	mu.Lock()
	failed := slices.Clone(failures)
	mu.Unlock()
	if len(failed) == 0 {
		switch idx, t2, ok := c.agreedLeader(ctx, frozen); {
		case !ok || t2 != term:
			return fmt.Sprintf("the request succeeded at once through follower %s: member %d leads at term %d (agreed: %v) since %s froze at term %d", follower.name, idx, t2, ok, m.name, term)
		case idx != frozen:
			t.Fatalf("the request succeeded at once through follower %s: the member frozen, %s, was not the leader (member %d is, at term %d, the term before the freeze)", follower.name, m.name, idx, term)
		}
		t.Fatalf("the request succeeded at once through follower %s while %s, frozen, still leads at term %d as the others say: it never reached the frozen leader", follower.name, m.name, term)
	}
	for _, f := range failed {
		t.Logf("met the frozen leader %s (term %d): %v", m.name, term, f)
		if !coordinator.IsTransient(f) {
			t.Errorf("a non-transient failure, retried: %v", f)
		}
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	if err := landed(rctx, cli); err != nil {
		t.Fatalf("after the retry, read back through %s: %v", follower.name, err)
	}
	return ""
}
