package chaos

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/examples"
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
