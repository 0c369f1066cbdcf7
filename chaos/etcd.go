package chaos

import (
	"fmt"
	"time"
)

// etcdKinds are the faults on the etcd cluster and the coordinators. None
// changes the ring by itself: a 3-member cluster keeps its quorum with one
// member lost, and the ring trains on while its coordinator fails over.
// Each heal's evidence carries the recovery figures, against the lease
// TTL: when another etcd member led and the cluster took a write again,
// or when a standby coordinator led and decided its first generation; a
// paused coordinator's, that it stepped down once continued and wrote
// nothing.
func etcdKinds() []Kind {
	return []Kind{
		{Name: "etcd-kill", Doc: "SIGKILL an etcd member (target rank:N is member N, random a random one, none the leader); with a duration it is restarted on its data after it, else it stays dead (two of three keep the quorum)",
			Needs: "etcd", Changes: "none",
			New: func(p Planned) Fault { return &memberFault{p: p} }},
		{Name: "etcd-pause", Doc: "SIGSTOP an etcd member (target as etcd-kill; none: the leader) for the fault's duration, then SIGCONT; keep it under the lease TTL",
			Needs: "etcd", Changes: "none",
			New: func(p Planned) Fault { return &memberFault{p: p, stop: true} }},
		{Name: "coordinator-leader-kill", Doc: "SIGKILL the coordinator process that leads the job's election: a standby takes over within the lease TTL and decides the next generations",
			Needs: "etcd", Changes: "none",
			New: func(p Planned) Fault { return &coordinatorKill{} }},
		{Name: "coordinator-leader-pause", Doc: "SIGSTOP the coordinator process that leads the job's election until its lease has expired and a standby leads (no earlier than the fault's duration, which it needs), then SIGCONT: " +
			"the deposed coordinator must step down (its requests refused by the fence, or its session found expired) and campaign again behind the new leader, and write no generation",
			Needs: "etcd", Changes: "none",
			New: func(p Planned) Fault { return &coordinatorPause{} }},
	}
}

// clusterJob is smallJob on a 3-member etcd cluster with two coordinator
// processes, longer: a fault fired while etcd elects a leader
// waits for the runner's read of the ring (about 1.5s, a few hundred
// steps), and the job must still be running then. Its first ring has two
// workers at least, so that one worker killed never takes the only copy of
// the model with it (a ring of one whose newcomers had not synced yet
// starts over from step 1, on a slow machine: seen under -race). The
// scenarios' faults come at step 150, once every worker has joined: a
// worker still joining during an etcd election fails the job (its
// configuration claim gets "etcdserver: request timed out" and is not
// retried; seen under -race). Its steps must outlast the worker's kill 6s
// after the first step with seconds to spare: 16,000 steps took 12.7s on
// two cores (1,260 steps a second; 6,000 once ended before the kill, when
// a bulk-synchronous step lost its control round trip).
func clusterJob(workers int) JobSpec {
	j := smallJob(workers, 0)
	j.Etcd, j.Coordinators, j.Steps, j.MinWorkers = "cluster", 2, 16000, min(2, workers)
	return j
}

// etcdScenarios are the built-in scenarios of etcd and coordinator faults.
// Each kills a worker 6s after the first step, well after its fault (a
// step trigger could fire while the job's steps race ahead of the
// scheduler, which reads the ring from etcd during the election), so that the job's coordinator must
// decide a new ring through what is left of the cluster, or (after a
// coordinator's loss) the standby must.
func etcdScenarios() []Scenario {
	return []Scenario{
		{Name: "etcd-leader-kill", CI: true,
			Description: "SIGKILL of the etcd cluster's leader (it stays dead: two of three keep the quorum), then of a worker: the coordinator decides the new ring through the two members left",
			Job:         clusterJob(3),
			Faults: []FaultSpec{
				{Kind: "etcd-kill", Trigger: Trigger{Step: 150}},
				{Kind: "sigkill", Target: "random", Trigger: Trigger{After: Duration(6 * time.Second)}},
			}},
		{Name: "etcd-pause", CI: true,
			Description: "SIGSTOP of the etcd cluster's leader for 2s (under the lease TTL), then SIGCONT, then SIGKILL of a worker: the ring trains on, and the new ring is decided",
			Job:         clusterJob(3),
			Faults: []FaultSpec{
				{Kind: "etcd-pause", Trigger: Trigger{Step: 150}, Duration: Duration(2 * time.Second)},
				{Kind: "sigkill", Target: "random", Trigger: Trigger{After: Duration(6 * time.Second)}},
			}},
		{Name: "etcd-pause-at-join", CI: true,
			Description: "SIGSTOP of the etcd cluster's leader for 3s as the job is launched, while its workers claim the job's configuration and register: " +
				"their requests time out and are retried, the coordinator keeps its leadership, the job trains; then SIGKILL of a worker",
			Job: clusterJob(3),
			Faults: []FaultSpec{
				{Kind: "etcd-pause", Trigger: Trigger{On: "launch"}, Duration: Duration(3 * time.Second)},
				{Kind: "sigkill", Target: "random", Trigger: Trigger{After: Duration(6 * time.Second)}},
			}},
		{Name: "coordinator-failover", CI: true,
			Description: "SIGKILL of the coordinator that leads, then of a worker: the standby coordinator takes over within the lease TTL and decides the new ring",
			Job:         clusterJob(3),
			Faults: []FaultSpec{
				{Kind: "coordinator-leader-kill", Trigger: Trigger{Step: 150}},
				{Kind: "sigkill", Target: "random", Trigger: Trigger{After: Duration(6 * time.Second)}},
			}},
		{Name: "coordinator-pause", CI: true,
			Description: "SIGSTOP of the coordinator that leads, past its lease TTL: the standby takes over; then SIGCONT: the deposed coordinator finds its leadership gone, " +
				"steps down and campaigns again, and writes nothing; then SIGKILL of a worker, whose ring the new leader decides",
			Job: clusterJob(3),
			Faults: []FaultSpec{
				// The duration is the lease TTL; the heal waits on for the standby to lead.
				{Kind: "coordinator-leader-pause", Trigger: Trigger{Step: 150}, Duration: Duration(5 * time.Second)},
				{Kind: "sigkill", Target: "random", Trigger: Trigger{After: Duration(6 * time.Second)}},
			}},
		{Name: "etcd-member-restart",
			Description: "SIGKILL of etcd member 1 for 3s, then restarted on its data; then SIGKILL of a worker",
			Job:         clusterJob(3),
			Faults: []FaultSpec{
				{Kind: "etcd-kill", Target: "rank:1", Trigger: Trigger{Step: 150}, Duration: Duration(3 * time.Second)},
				{Kind: "sigkill", Target: "random", Trigger: Trigger{After: Duration(6 * time.Second)}},
			}},
	}
}

// EtcdRecovery are a report's recovery figures for its etcd and
// coordinator faults, a line each: the time from the injection to the
// job's next step, and the heal's figures (another etcd leader and a
// write taken, or the standby coordinator leading and deciding), against
// the lease TTL; and each later ring change's recovery.
func EtcdRecovery(rep *Report) []string {
	var out []string
	for _, f := range rep.Faults {
		switch {
		case f.Injected.IsZero():
			continue
		case f.Kind == "etcd-kill" || f.Kind == "etcd-pause" || f.Kind == "coordinator-leader-kill" || f.Kind == "coordinator-leader-pause":
			at := f.Injected.Sub(rep.Started).Seconds()
			next := "no step after it"
			for _, s := range rep.Steps {
				if s.T > at && s.Step > f.AtStep {
					next = fmt.Sprintf("next step (%d) %.2fs after", s.Step, s.T-at)
					break
				}
			}
			out = append(out, fmt.Sprintf("fault %d (%s) at step %d: %s; %s", f.Index, f.Kind, f.AtStep, next, f.HealWhat))
		case f.RecoveryS > 0:
			out = append(out, fmt.Sprintf("fault %d (%s) at step %d: the new ring's first step %.2fs after", f.Index, f.Kind, f.AtStep, f.RecoveryS))
		}
	}
	return out
}
