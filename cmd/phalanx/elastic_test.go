package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/worker"
)

// syncBuffer is a bytes.Buffer safe for a child's stdout and stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// liveJob is a phalanx process (a launcher, usually) whose events the test
// reads as they happen, through a pipe given as --events /dev/fd/3.
type liveJob struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	events chan map[string]any
	seen   []map[string]any
	exited chan error
}

func command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "PHALANX_TEST_AS_COMMAND=1")
	return cmd
}

// startProcess starts a phalanx command that is killed when the test ends;
// its output is shown when the test fails.
func startProcess(t *testing.T, name string, args ...string) (*exec.Cmd, *syncBuffer, func() error) {
	t.Helper()
	return startProcessEnv(t, name, nil, args...)
}

// startProcessEnv is startProcess with more environment.
func startProcessEnv(t *testing.T, name string, env []string, args ...string) (*exec.Cmd, *syncBuffer, func() error) {
	t.Helper()
	cmd := command(t, args...)
	cmd.Env = append(cmd.Env, env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var werr error
	go func() { werr = cmd.Wait(); close(exited) }()
	wait := func() error { <-exited; return werr }
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s output:\n%s", name, lastLines(out.String(), 60))
		}
	})
	return cmd, out, wait
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func startJob(t *testing.T, args ...string) *liveJob {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := command(t, append([]string{"train", "--events", "/dev/fd/3"}, args...)...)
	cmd.ExtraFiles = []*os.File{w}
	j := &liveJob{cmd: cmd, out: &syncBuffer{}, events: make(chan map[string]any, 1<<16), exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = j.out, j.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		defer close(j.events)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
		for sc.Scan() {
			var e map[string]any
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e = map[string]any{"event": "garbage", "line": sc.Text()}
			}
			j.events <- e
		}
	}()
	go func() { j.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		for range j.events {
		}
		if t.Failed() {
			t.Logf("launcher output:\n%s", lastLines(j.out.String(), 80))
		}
	})
	return j
}

// until reads events until one satisfies pred, and returns it.
func (j *liveJob) until(t *testing.T, what string, pred func(map[string]any) bool) map[string]any {
	t.Helper()
	for e := range j.events {
		j.seen = append(j.seen, e)
		if pred(e) {
			return e
		}
	}
	t.Fatalf("the job ended before %s", what)
	return nil
}

// finish reads the remaining events and checks the job succeeded.
func (j *liveJob) finish(t *testing.T) map[string][]map[string]any {
	t.Helper()
	for e := range j.events {
		j.seen = append(j.seen, e)
	}
	if err := <-j.exited; err != nil {
		t.Fatalf("the job failed: %v", err)
	}
	by := map[string][]map[string]any{}
	for _, e := range j.seen {
		k, _ := e["event"].(string)
		by[k] = append(by[k], e)
	}
	return by
}

// stepIn: a step from the given one on, trained by a ring of world workers
// (the first rendezvous may start with fewer, the rest joining later).
func stepIn(world, step int) func(map[string]any) bool {
	return func(e map[string]any) bool {
		return e["event"] == "step" && e["world"].(float64) == float64(world) && e["step"].(float64) >= float64(step)
	}
}

func worldIs(n int) func(map[string]any) bool {
	return func(e map[string]any) bool { return e["event"] == "generation" && e["world"].(float64) == float64(n) }
}

func num(e map[string]any, k string) int { return int(e[k].(float64)) }

// workerPids returns the pids of the launcher's workers seen so far, by
// launch index.
func (j *liveJob) workerPids() map[int]int {
	out := map[int]int{}
	for _, e := range j.seen {
		if e["event"] == "worker_started" {
			out[num(e, "worker")] = num(e, "pid")
		}
	}
	return out
}

// checkSamples proves that the job trained every step once, in order, on
// exactly the sampler's global batch: no sample of an epoch lost or repeated.
func checkSamples(t *testing.T, steps []map[string]any, total, samples, batch int, seed uint64) {
	t.Helper()
	s, err := worker.NewSampler(samples, seed)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != total {
		t.Fatalf("%d step events, want %d", len(steps), total)
	}
	var pos worker.Position
	for i, e := range steps {
		if num(e, "step") != i+1 {
			t.Fatalf("step event %d is of step %d", i+1, num(e, "step"))
		}
		idx, _, next, err := s.Batch(pos, batch, 1, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := worker.FingerprintOf(idx)
		var got worker.Fingerprint
		for k, v := range e["fingerprint"].([]any) {
			got[k] = v.(float64)
		}
		if got != want {
			t.Fatalf("step %d (generation %v, world %v) trained on samples with fingerprint %v; the sampler's global batch has %v",
				i+1, e["generation"], e["world"], got, want)
		}
		if int64(num(e, "epoch")) != next.Epoch || int64(num(e, "offset")) != next.Offset {
			t.Fatalf("step %d ended at %v/%v, want %+v", i+1, e["epoch"], e["offset"], next)
		}
		pos = next
	}
}

var elasticJobArgs = []string{"--steps", "120", "--samples", "8000", "--batch", "256", "--hidden", "64", "--seed", "3", "--threads", "1"}

// TestElasticKillOne: SIGKILL one of 4 workers mid-epoch. The other three
// processes carry on in a new ring at once (the loss detected from the
// connection reset, verified by the coordinator), redo no step, train every
// sample of every epoch exactly once, and end within 1% of the accuracy of
// the same job undisturbed.
func TestElasticKillOne(t *testing.T) {
	base := append([]string{"--workers", "4"}, elasticJobArgs...)
	clean := startJob(t, base...).finish(t)
	j := startJob(t, base...)
	j.until(t, "step 45 in a ring of 4", stepIn(4, 45)) // epoch 2, in its middle
	started := j.workerPids()
	victim := started[2]
	killed := time.Now()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	g := j.until(t, "a ring of 3", worldIs(3))
	next := j.until(t, "a step in the new ring", func(e map[string]any) bool { return e["event"] == "step" && e["world"] == 3.0 })
	t.Logf("SIGKILL → generation %v → step %v in the new ring: %.3fs", g["generation"], next["step"],
		next["ts"].(float64)-float64(killed.UnixNano())/1e9)
	ev := j.finish(t)

	checkSamples(t, ev["step"], 120, 8000, 256, 3)
	lost := ev["worker_lost"]
	if len(lost) != 1 || num(lost[0], "pid") != victim || !strings.Contains(lost[0]["detected_by"].(string), "reported by") {
		t.Errorf("worker_lost events %v, want one for pid %d detected by a peer's report", lost, victim)
	}
	if r := ev["restored"]; num(r[len(r)-1], "steps_redone") != 0 || num(r[len(r)-1], "world") != 3 {
		t.Errorf("restored events %v, want one with no step redone", r)
	}
	final := ev["generation"][len(ev["generation"])-1]
	for _, m := range final["members"].([]any) {
		pid := num(m.(map[string]any), "pid")
		if pid != started[0] && pid != started[1] && pid != started[3] {
			t.Errorf("the final ring has pid %d, not one of the first survivors %v", pid, started)
		}
	}
	for _, x := range ev["worker_exited"] {
		if num(x, "worker") != 2 && x["status"] != "exit 0" {
			t.Errorf("survivor %v", x)
		}
	}
	a, b := clean["done"][0]["accuracy"].(float64), ev["done"][0]["accuracy"].(float64)
	if math.Abs(a-b) > 0.01 {
		t.Errorf("accuracy %.4f after losing a worker, %.4f undisturbed: more than 1%% apart", b, a)
	}
	t.Logf("accuracy %.4f undisturbed, %.4f with a worker killed at step 45", a, b)
}

// workerArgs is the command line of one more worker for a running
// launcher's job started with trainArgs: phalanx worker with the job's
// etcd and name from its job_started event, and the training flags.
func workerArgs(t *testing.T, j *liveJob, index int, trainArgs ...string) []string {
	t.Helper()
	launcherOnly := map[string]bool{"--workers": true, "--join-window": true, "--max-workers": true, "--min-workers": true, "--threads": true}
	for _, e := range j.seen {
		if e["event"] == "job_started" {
			args := []string{"worker", "--etcd-endpoints", e["etcd_endpoints"].(string), "--job", e["job"].(string),
				"--threads", "1", "--worker-index", fmt.Sprint(index)}
			for i := 0; i < len(trainArgs); i += 2 {
				if !launcherOnly[trainArgs[i]] {
					args = append(args, trainArgs[i], trainArgs[i+1])
				}
			}
			return args
		}
	}
	t.Fatal("no job_started event")
	return nil
}

// startSpecWorker starts one more worker of a running launcher's job the
// library's way: this binary with the job_started event's worker_env.
func startSpecWorker(t *testing.T, j *liveJob, name string) (*syncBuffer, func() error) {
	t.Helper()
	for _, e := range j.seen {
		if e["event"] == "job_started" {
			_, out, wait := startProcessEnv(t, name, []string{e["worker_env"].(string)})
			return out, wait
		}
	}
	t.Fatal("no job_started event")
	return nil, nil
}

// TestElasticKillTwoThenRejoin: two of 4 workers killed at once leave a ring
// of 2; a worker started again joins it (it receives the state over the data
// plane), and the job ends with every sample trained once per epoch.
func TestElasticKillTwoThenRejoin(t *testing.T) {
	j := startJob(t, append([]string{"--workers", "4", "--join-window", "200ms", "--lease-ttl", "10s"}, elasticJobArgs...)...)
	j.until(t, "step 30 in a ring of 4", stepIn(4, 30))
	p := j.workerPids()
	syscall.Kill(p[1], syscall.SIGKILL)
	syscall.Kill(p[3], syscall.SIGKILL)
	j.until(t, "a ring of 2", worldIs(2))
	j.until(t, "a step in the ring of 2", func(e map[string]any) bool { return e["event"] == "step" && e["world"] == 2.0 })
	// The survivors are frozen while the worker starts, so that the job
	// cannot end before it is admitted (their leases outlast the pause).
	freeze(t, p[0], p[2])
	out, exited := startSpecWorker(t, j, "rejoined worker")
	j.until(t, "the rejoined worker", worldIs(3))
	thaw(t, p[0], p[2])
	ev := j.finish(t)
	if err := exited(); err != nil {
		t.Fatalf("the rejoined worker: %v\n%s", err, lastLines(out.String(), 30))
	}
	checkSamples(t, ev["step"], 120, 8000, 256, 3)
	if n := len(ev["worker_lost"]); n != 2 {
		t.Errorf("%d worker_lost events, want 2", n)
	}
	if last := ev["worker_joined"][len(ev["worker_joined"])-1]; num(last, "pid") == p[0] || num(last, "generation") < 3 {
		t.Errorf("worker_joined %v, want the restarted worker last", ev["worker_joined"])
	}
	if d := ev["done"][0]; num(d, "world") != 3 {
		t.Errorf("done in a world of %v, want 3", d["world"])
	}
	for _, r := range ev["restored"] {
		if num(r, "steps_redone") != 0 {
			t.Errorf("restored %v: steps redone", r)
		}
	}
}

// TestElasticFifthWorker: a fifth worker started during a 4-worker job is
// admitted after the join window and trains to the end.
func TestElasticFifthWorker(t *testing.T) {
	args := append([]string{"--workers", "4", "--max-workers", "5", "--join-window", "200ms", "--lease-ttl", "10s"}, elasticJobArgs...)
	j := startJob(t, args...)
	j.until(t, "step 20 in a ring of 4", stepIn(4, 20))
	p := j.workerPids()
	freeze(t, p[0], p[1], p[2], p[3])
	_, out, exited := startProcess(t, "fifth worker", workerArgs(t, j, 4, args...)...)
	g := j.until(t, "a ring of 5", worldIs(5))
	thaw(t, p[0], p[1], p[2], p[3])
	ev := j.finish(t)
	if err := exited(); err != nil {
		t.Fatalf("the fifth worker: %v\n%s", err, lastLines(out.String(), 30))
	}
	checkSamples(t, ev["step"], 120, 8000, 256, 3)
	if jn := ev["worker_joined"]; num(jn[len(jn)-1], "rank") != 4 {
		t.Errorf("worker_joined %v, want the newcomer at rank 4", ev["worker_joined"])
	}
	if len(ev["worker_lost"]) != 0 || num(ev["done"][0], "world") != 5 {
		t.Errorf("lost %v; done %v; generation %v", ev["worker_lost"], ev["done"], g)
	}
}

// freeze stops processes (SIGSTOP); thaw resumes them.
func freeze(t *testing.T, pids ...int) {
	t.Helper()
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { thaw(t, pids...) })
}

func thaw(t *testing.T, pids ...int) {
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGCONT)
	}
}

// TestCoordinatorLeaderKilled: two coordinator processes campaign; the
// leader is killed mid-run. Training goes on in the same ring, and when a
// worker is then lost, the standby, now leading, decides the new ring.
func TestCoordinatorLeaderKilled(t *testing.T) {
	e, err := coordinator.StartEmbedded(context.Background(), coordinator.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ep := strings.Join(e.Endpoints(), ",")
	job := fmt.Sprintf("leader-kill-%d", time.Now().UnixNano())
	coords := map[string]*exec.Cmd{}
	for _, id := range []string{"coord-a", "coord-b"} {
		cmd, _, _ := startProcess(t, id, "coordinator", "--etcd-endpoints", ep, "--job", job, "--id", id,
			"--lease-ttl", "2s", "--join-window", "300ms", "--max-workers", "3")
		coords[id] = cmd
	}
	j := startJob(t, append([]string{"--workers", "3", "--coordinator=false", "--etcd-endpoints", ep, "--job", job,
		"--lease-ttl", "2s"}, elasticJobArgs...)...)
	g := j.until(t, "a ring of 3", worldIs(3))
	leader := g["decided_by"].(string)
	standby := map[string]string{"coord-a": "coord-b", "coord-b": "coord-a"}[leader]
	if standby == "" {
		t.Fatalf("generation decided by %q", leader)
	}
	j.until(t, "step 20 in a ring of 3", stepIn(3, 20))
	if err := coords[leader].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	j.until(t, "step 40 in the same ring", func(e map[string]any) bool {
		if e["event"] == "generation" {
			t.Fatalf("a new generation %v after the coordinator was killed, with no worker lost", e)
		}
		return e["event"] == "step" && e["step"].(float64) >= 40
	})
	syscall.Kill(j.workerPids()[1], syscall.SIGKILL)
	g2 := j.until(t, "a ring of 2", worldIs(2))
	if g2["decided_by"] != standby {
		t.Errorf("the ring of 2 was decided by %v, want the standby %s", g2["decided_by"], standby)
	}
	ev := j.finish(t)
	checkSamples(t, ev["step"], 120, 8000, 256, 3)
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

// TestEtcdLeaderKilled: the job's membership lives in a 3-member etcd
// cluster of separate processes; killing its leader mid-run interrupts
// nothing: no worker is lost, every step is trained once.
func TestEtcdLeaderKilled(t *testing.T) {
	ports := freePorts(t, 6)
	var cluster, endpoints []string
	for i := range 3 {
		cluster = append(cluster, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[3+i]))
		endpoints = append(endpoints, fmt.Sprintf("http://127.0.0.1:%d", ports[i]))
	}
	members := make([]*exec.Cmd, 3)
	dir := t.TempDir()
	for i := range 3 {
		members[i], _, _ = startProcess(t, fmt.Sprintf("etcd m%d", i), "etcd", "--name", fmt.Sprintf("m%d", i),
			"--dir", fmt.Sprintf("%s/m%d", dir, i), "--client-port", fmt.Sprint(ports[i]), "--peer-port", fmt.Sprint(ports[3+i]),
			"--initial-cluster", strings.Join(cluster, ","))
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaderOf := func() int {
		t.Helper()
		for i, ep := range endpoints {
			st, err := cli.Status(ctx, ep)
			if err != nil {
				t.Fatalf("status of %s: %v", ep, err)
			}
			if st.Leader == st.Header.MemberId {
				return i
			}
		}
		t.Fatal("no member is the leader")
		return -1
	}
	if _, err := cli.Put(ctx, "/phalanx-test/ready", "1"); err != nil { // waits for the cluster to form
		t.Fatal(err)
	}
	j := startJob(t, append([]string{"--workers", "3", "--etcd-endpoints", strings.Join(endpoints, ",")}, elasticJobArgs...)...)
	j.until(t, "step 20 in a ring of 3", stepIn(3, 20))
	l := leaderOf()
	if err := members[l].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	ev := j.finish(t)
	checkSamples(t, ev["step"], 120, 8000, 256, 3)
	if len(ev["worker_lost"]) != 0 || len(ev["generation"]) != 1 {
		t.Errorf("after killing etcd member m%d (the leader): lost %v, generations %v", l, ev["worker_lost"], ev["generation"])
	}
}

// TestElasticFrozenWorker: a worker frozen with SIGSTOP keeps its sockets
// open, so nobody's connection resets; its lease expires and the others go on
// without it. Resumed with SIGCONT, the same process finds itself out of the
// ring, registers again and is readmitted; nobody's state is corrupted.
func TestElasticFrozenWorker(t *testing.T) {
	j := startJob(t, append([]string{"--workers", "4", "--lease-ttl", "2s", "--join-window", "200ms"}, elasticJobArgs...)...)
	j.until(t, "step 20 in a ring of 4", stepIn(4, 20))
	victim := j.workerPids()[1]
	stopped := time.Now()
	freeze(t, victim)
	j.until(t, "a ring of 3", worldIs(3))
	next := j.until(t, "a step in the ring of 3", func(e map[string]any) bool { return e["event"] == "step" && e["world"] == 3.0 })
	t.Logf("SIGSTOP → step %v in the new ring: %.3fs (lease TTL 2s)", next["step"], next["ts"].(float64)-float64(stopped.UnixNano())/1e9)
	thaw(t, victim)
	back := j.until(t, "the thawed worker back in the ring", worldIs(4))
	ev := j.finish(t)
	checkSamples(t, ev["step"], 120, 8000, 256, 3)
	lost := ev["worker_lost"]
	if len(lost) != 1 || num(lost[0], "pid") != victim || lost[0]["detected_by"] != "lease expired" {
		t.Errorf("worker_lost %v, want pid %d by lease expiry", lost, victim)
	}
	found := false
	for _, m := range back["members"].([]any) {
		found = found || num(m.(map[string]any), "pid") == victim
	}
	if !found {
		t.Errorf("ring of 4 %v without the thawed process %d", back["members"], victim)
	}
}

// TestHybridExcludesStraggler: in hybrid mode a worker made 3x slower (steps
// 10 to 80) misses its step deadlines and is excluded through the
// coordinator within the configured window (a generation without it, with a
// straggler_excluded event); on probation it keeps receiving the ring's
// parameters and times its own steps against the ring's pace, and once the
// injection ends it is readmitted (straggler_readmitted). Every rank ends
// with the same parameters, at the accuracy of an undisturbed run.
func TestHybridExcludesStraggler(t *testing.T) {
	const from, to, window = 10, 80, 8
	args := []string{"--workers", "4", "--steps", "200", "--samples", "8000", "--batch", "256", "--seed", "3", "--threads", "1"}
	clean := startJob(t, args...).finish(t)
	j := startJob(t, append(args, "--sync", "hybrid", "--deadline-factor", "1.5", "--exclude-after", fmt.Sprintf("6/%d", window),
		"--inject-slow", fmt.Sprintf("rank=3,factor=3,from=%d,to=%d", from, to), "--readmit-after", "3")...)
	j.until(t, "step 5 in a ring of 4", stepIn(4, 5))
	slow := j.workerPids()[3]
	ev := j.finish(t)
	ex := ev["straggler_excluded"]
	if len(ex) == 0 || num(ex[0], "late_in") < 6 || num(ex[0], "window") != window || num(ex[0], "step") > from+window {
		t.Fatalf("straggler_excluded events %v: want the first by step %d, late in at least 6 of %d", ex, from+window, window)
	}
	for _, e := range ex {
		if num(e, "pid") != slow {
			t.Fatalf("straggler_excluded %v: only the slow worker (pid %d) should be", e, slow)
		}
	}
	if ev["done"][0]["parameters_identical"] != true {
		t.Fatalf("done %v: the ranks' parameters differ", ev["done"][0])
	}
	fed := ev["straggler_fed"]
	if len(fed) == 0 || fed[0]["id"] != ex[0]["id"] || num(fed[0], "step") < 1 {
		t.Fatalf("straggler_fed events %v: the excluded worker should keep receiving the ring's parameters", fed)
	}
	re := ev["straggler_readmitted"]
	if len(re) != len(ex) || num(re[len(re)-1], "pid") != slow {
		t.Fatalf("straggler_readmitted events %v after exclusions %v: want the slow worker (pid %d) readmitted after each", re, ex, slow)
	}
	back := num(re[len(re)-1], "generation")
	for _, e := range ev["step"] {
		if num(e, "generation") == back && num(e, "step") <= to {
			t.Fatalf("step %v of generation %d: the straggler's last readmission came before its injection ended (step %d)", e["step"], back, to)
		}
	}
	stale := 0
	for _, e := range ev["step"] {
		stale += num(e, "stale")
	}
	if last := ev["generation"][len(ev["generation"])-1]; stale == 0 || last["world"] != 4.0 || len(ev["worker_lost"]) != 0 {
		t.Fatalf("%d stale step reports, final generation %v, lost %v", stale, last, ev["worker_lost"])
	}
	a, b := clean["done"][0]["accuracy"].(float64), ev["done"][0]["accuracy"].(float64)
	if math.Abs(a-b) > 0.01 {
		t.Errorf("accuracy %.4f with the straggler excluded, %.4f undisturbed: more than 1%% apart", b, a)
	}
	t.Logf("excluded at step %v (late in %v of %d); %d exclusions; accuracy %.4f vs %.4f undisturbed", ex[0]["step"], ex[0]["late_in"], window, len(ex), b, a)
}

// TestHybridPausedRank: a rank paused for three step deadlines (fault
// injection inside its model code) is not waited for: the steps close
// without it, it joins their reductions while paused, catches up and goes
// on in the same ring, the same process, with no restart and no loss.
func TestHybridPausedRank(t *testing.T) {
	args := []string{"--workers", "4", "--steps", "60", "--samples", "8000", "--hidden", "64", "--seed", "3", "--threads", "1",
		"--sync", "hybrid", "--step-deadline", "100ms", "--exclude-after", "0/0", "--inject-pause", "rank=2,at=30,for=300ms"}
	ev := startJob(t, args...).finish(t)
	stale := 0
	for _, e := range ev["step"] {
		stale += num(e, "stale")
	}
	if stale == 0 || len(ev["generation"]) != 1 || len(ev["worker_lost"]) != 0 || len(ev["rank_restarted"]) != 0 || len(ev["step"]) != 60 ||
		ev["done"][0]["parameters_identical"] != true {
		t.Fatalf("stale %d, generations %d, lost %v, restarts %v, %d steps", stale, len(ev["generation"]), ev["worker_lost"], ev["rank_restarted"], len(ev["step"]))
	}
}

// TestHybridStoppedProcess: a worker process stopped with SIGSTOP for three
// step deadlines and resumed with SIGCONT freezes its data plane too, so the
// others wait in the step's reduction rather than close without it; resumed,
// it goes on in the same ring, without a restart and without a loss.
func TestHybridStoppedProcess(t *testing.T) {
	args := []string{"--workers", "4", "--steps", "60", "--samples", "8000", "--hidden", "64", "--seed", "3", "--threads", "1",
		"--sync", "hybrid", "--step-deadline", "100ms", "--exclude-after", "0/0"}
	j := startJob(t, args...)
	j.until(t, "step 20 in a ring of 4", stepIn(4, 20))
	pid := j.workerPids()[2]
	freeze(t, pid)
	time.AfterFunc(300*time.Millisecond, func() { thaw(t, pid) }) // the fault lasts three deadlines
	ev := j.finish(t)
	if len(ev["generation"]) != 1 || len(ev["worker_lost"]) != 0 || len(ev["rank_restarted"]) != 0 || len(ev["step"]) != 60 {
		t.Fatalf("generations %d, lost %v, restarts %v, %d steps", len(ev["generation"]), ev["worker_lost"], ev["rank_restarted"], len(ev["step"]))
	}
}
