package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/examples"
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
	dir := os.Getenv("CHAOS_KEEP_DIR") // failed runs kept there, for a look
	if dir == "" {
		dir = t.TempDir()
	}
	r := &Runner{Registry: examples.Registry(), Dir: dir}
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

// TestEtcdKindsNeedTheCluster: the etcd kinds are refused on a job without
// job.etcd cluster, and a cluster job names its coordinators' count.
func TestEtcdKindsNeedTheCluster(t *testing.T) {
	for _, k := range []string{"etcd-kill", "etcd-pause", "coordinator-leader-kill"} {
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
// the coordinator package retries itself all outlive it.
func TestRetryThroughEtcdLeaderPause(t *testing.T) {
	if testing.Short() {
		t.Skip("a real etcd cluster: not in -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
	keys, _ := coordinator.KeysFor("retry")
	for _, tc := range []struct {
		name string
		op   func(ctx context.Context, cli *clientv3.Client, failures *[]error) error
	}{
		{"claim the configuration", func(ctx context.Context, cli *clientv3.Client, failures *[]error) error {
			var recorded string
			err := coordinator.Retry(ctx, time.Minute, func(err error) { *failures = append(*failures, err) }, func(ctx context.Context) (err error) {
				recorded, err = coordinator.ClaimConfig(ctx, cli, keys, "hash-1")
				return err
			})
			if err == nil && recorded != "hash-1" {
				err = fmt.Errorf("recorded %q", recorded)
			}
			if err == nil && len(*failures) == 0 {
				err = errors.New("the first claim did not fail: the test no longer reaches the frozen leader")
			}
			return err
		}},
		{"leave", func(ctx context.Context, cli *clientv3.Client, _ *[]error) error {
			return coordinator.Leave(ctx, cli, keys, "w1", "scaled down")
		}},
		{"request a stop", func(ctx context.Context, cli *clientv3.Client, _ *[]error) error {
			return coordinator.RequestStop(ctx, cli, keys, "operator")
		}},
		{"exclude a straggler", func(ctx context.Context, cli *clientv3.Client, _ *[]error) error {
			return coordinator.Exclude(ctx, cli, keys, &phalanxpb.Exclusion{Id: "w2", LateIn: 6, Window: 8})
		}},
		{"readmit it", func(ctx context.Context, cli *clientv3.Client, _ *[]error) error {
			return coordinator.Readmit(ctx, cli, keys, "w2")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lead, _ := c.leader(ctx, -1)
			if lead < 0 {
				t.Fatal("no etcd leader")
			}
			follower := c.members[(lead+1)%len(c.members)]
			cli, err := coordinator.Connect([]string{follower.client}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			frozen := c.members[lead].pid
			if err := syscall.Kill(frozen, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			defer syscall.Kill(frozen, syscall.SIGCONT)
			var failures []error
			if err := tc.op(ctx, cli, &failures); err != nil {
				t.Fatalf("through the frozen leader: %v", err)
			}
			for _, f := range failures {
				t.Logf("retried after: %v", f)
				if !coordinator.IsTransient(f) {
					t.Errorf("retried a non-transient error: %v", f)
				}
			}
		})
	}
}
