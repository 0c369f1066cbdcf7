package coordinator

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// A deposed leader that is still alive: a coordinator (or shard-map
// writer) runs in a process of its own (this test binary, re-executed),
// is SIGSTOPped past its session TTL so that its lease expires and the
// standby leads and decides, then SIGCONTed. Its own requests, made with
// its own old election key and revision, must be refused by etcd's
// comparison, and it must step down: campaign again behind the new
// leader and write nothing.

// helperEnv, in this test binary's environment, makes it a helper process
// (TestMain runs runHelper instead of the tests).
const helperEnv = "PHALANX_COORDINATOR_TEST_HELPER"

// deposedTTL is the helper's and standby's session TTL: the tests wait
// for it to expire once (after the SIGSTOP), and a loaded 2-core machine
// must not lose a live leader's session to a late keep-alive.
const deposedTTL = 8 * time.Second

// helperSpec is what a helper process runs.
type helperSpec struct {
	Role      string        `json:"role"` // "coordinator" or "shardmap"
	Endpoints []string      `json:"endpoints"`
	Job       string        `json:"job"`
	ID        string        `json:"id"`
	TTL       time.Duration `json:"ttl"`
	Servers   int           `json:"servers"` // a shard-map writer's first map waits for this many
}

// helperEvent is a line of a helper's stdout: it led (its election key and
// revision), stepped down (why), decided a generation or wrote a shard
// map, or answered a command ("read", "write": its own request made with
// the election key and revision it last led with, and whether etcd
// refused it).
type helperEvent struct {
	Event      string `json:"event"`
	Key        string `json:"key,omitempty"`
	Rev        int64  `json:"rev,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	Refused    bool   `json:"refused,omitempty"`
	Error      string `json:"error,omitempty"`
}

// runHelper is a helper process: it runs its role until its stdin closes
// (or five minutes pass: it never outlives a test), and answers each
// command line of its stdin with an event.
func runHelper(raw string) int {
	var spec helperSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "helper spec:", err)
		return 2
	}
	keys, err := KeysFor(spec.Job)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(os.Stderr), zap.InfoLevel))
	cli, err := Connect(spec.Endpoints, nil, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cli.Close()
	var (
		mu  sync.Mutex
		enc = json.NewEncoder(os.Stdout)
		led []fence
	)
	emit := func(e helperEvent) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(e)
	}
	onLeadership := func(l Leadership) {
		if l.Leading {
			mu.Lock()
			led = append(led, fence{key: l.Key, rev: l.Rev})
			mu.Unlock()
			emit(helperEvent{Event: "leading", Key: l.Key, Rev: l.Rev})
			return
		}
		emit(helperEvent{Event: "stepped_down", Key: l.Key, Rev: l.Rev, Error: fmt.Sprint(l.Err)})
	}
	var read, write func(ctx context.Context, f fence) error
	switch spec.Role {
	case "coordinator":
		c, err := New(NewJob(cli, keys), Config{ID: spec.ID, Rendezvous: Rendezvous{MinWorkers: 1, MaxWorkers: 8}, JoinWindow: time.Millisecond,
			SessionTTL: spec.TTL, Logger: log, OnLeadership: onLeadership,
			OnDecision: func(g *phalanxpb.Generation) { emit(helperEvent{Event: "decided", Generation: g.Number}) }})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go c.Run(ctx)
		read = func(ctx context.Context, f fence) error {
			_, err := c.read(ctx, f)
			return err
		}
		write = func(ctx context.Context, f fence) error {
			// The record as it is now: only the election key can refuse it.
			g, rev, err := NewJob(cli, keys).CurrentGeneration(ctx)
			if err != nil || g == nil {
				return fmt.Errorf("reading the generation: %v, %v", g, err)
			}
			return c.write(ctx, f, rev, &phalanxpb.Generation{Number: g.Number + 1, Members: g.Members, StartStep: g.StartStep,
				Reason: "written by a deposed coordinator"})
		}
	case "shardmap":
		go NewJob(cli, keys).RunShardMap(ctx, ShardMapConfig{ID: spec.ID, Shards: 3, Replicas: 2, Servers: spec.Servers, SessionTTL: spec.TTL,
			Logger: log, OnLeadership: onLeadership,
			OnMap: func(m *phalanxpb.ShardMap) { emit(helperEvent{Event: "map", Generation: m.Generation}) }})
		read = func(ctx context.Context, f fence) error {
			_, err := readShardMapState(ctx, cli, keys, f)
			return err
		}
		write = func(ctx context.Context, f fence) error {
			m, rev, err := NewJob(cli, keys).ReadShardMap(ctx)
			if err != nil || m == nil {
				return fmt.Errorf("reading the shard map: %v, %v", m, err)
			}
			next := proto.Clone(m).(*phalanxpb.ShardMap)
			next.Generation++
			next.Reason = "written by a deposed shard-map writer"
			val, err := proto.Marshal(next)
			if err != nil {
				return err
			}
			return writeShardMap(ctx, cli, keys, f, rev, val)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown helper role", spec.Role)
		return 2
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := in.Text()
		mu.Lock()
		var f fence
		if len(led) > 0 {
			f = led[len(led)-1]
		}
		mu.Unlock()
		op := map[string]func(context.Context, fence) error{"read": read, "write": write}[cmd]
		if op == nil || f.key == "" {
			emit(helperEvent{Event: cmd, Error: "unknown command, or never led"})
			continue
		}
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		err := op(rctx, f)
		rcancel()
		emit(helperEvent{Event: cmd, Key: f.key, Rev: f.rev, Refused: errors.Is(err, ErrLeadershipLost), Error: fmt.Sprint(err)})
	}
	return 0
}

// helperProc is a helper process seen from its test.
type helperProc struct {
	t     *testing.T
	pid   int
	stdin io.WriteCloser
	mu    sync.Mutex
	evs   []helperEvent
	more  chan struct{} // a token after each new event
}

// startHelper starts a helper process; the test's cleanup kills it, and
// on failure logs what it logged.
func startHelper(t *testing.T, spec helperSpec) *helperProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test binary
	logPath := filepath.Join(t.TempDir(), spec.ID+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h := &helperProc{t: t, more: make(chan struct{}, 1)}
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.pid = cmd.Process.Pid
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e helperEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				continue
			}
			h.mu.Lock()
			h.evs = append(h.evs, e)
			h.mu.Unlock()
			select {
			case h.more <- struct{}{}:
			default:
			}
		}
		cmd.Wait()
		logf.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		syscall.Kill(h.pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Errorf("helper %s (pid %d) not reaped 30s after SIGKILL", spec.ID, h.pid)
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("helper %s (pid %d) logged:\n%s", spec.ID, h.pid, b)
		}
	})
	return h
}

// events are the helper's events from index from on.
func (h *helperProc) events(from int) []helperEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.evs[min(from, len(h.evs)):])
}

func (h *helperProc) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.evs)
}

// send writes a command to the helper.
func (h *helperProc) send(cmd string) {
	h.t.Helper()
	if _, err := fmt.Fprintln(h.stdin, cmd); err != nil {
		h.t.Fatalf("command %q to the helper: %v", cmd, err)
	}
}

// waitFor returns the first event from index from on that matches, failing
// the test after d with what it waited for and the events it saw.
func (h *helperProc) waitFor(from int, d time.Duration, what string, match func(helperEvent) bool) helperEvent {
	h.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		evs := h.events(from)
		for _, e := range evs {
			if match(e) {
				return e
			}
		}
		select {
		case <-h.more:
		case <-timer.C:
			h.t.Fatalf("waited %v for %s; the helper's events since: %+v", d, what, evs)
		}
	}
}

func is(event string) func(helperEvent) bool {
	return func(e helperEvent) bool { return e.Event == event }
}

// waitUntil polls cond until it holds, failing the test after d with what
// it waited for and cond's last word on the state.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; last seen: %s", d, what, state)
		}
		<-tick.C
	}
}

// electionKeys are the campaign keys of the election at prefix, oldest
// first: the first leads, the others wait behind it.
func electionKeys(t *testing.T, ctx context.Context, cli *clientv3.Client, prefix string) []*mvccpb.KeyValue {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(rctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Kvs
}

func describe(kvs []*mvccpb.KeyValue) string {
	var out []string
	for _, kv := range kvs {
		out = append(out, fmt.Sprintf("%s=%s (rev %d)", kv.Key, kv.Value, kv.CreateRevision))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// versions are the values key took after revision since, newest first,
// read back from etcd's history.
func versions(t *testing.T, ctx context.Context, cli *clientv3.Client, key string, since int64) []*mvccpb.KeyValue {
	t.Helper()
	var out []*mvccpb.KeyValue
	var opts []clientv3.OpOption
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := cli.Get(rctx, key, opts...)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].ModRevision <= since {
			return out
		}
		out = append(out, resp.Kvs[0])
		opts = []clientv3.OpOption{clientv3.WithRev(resp.Kvs[0].ModRevision - 1)}
	}
}

func revision(t *testing.T, ctx context.Context, cli *clientv3.Client) int64 {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(rctx, "/phalanx-test/revision")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// deposed is what both tests do once standby leads and has decided:
// SIGCONT helper id, ask it for a read and a write under its old fence
// (each refused by etcd), see it step down and campaign again behind
// standby. It returns the revision before the SIGCONT and the index of
// the helper's first event after it.
func deposed(t *testing.T, ctx context.Context, cli *clientv3.Client, h *helperProc, id string, old helperEvent, election, standby string) (rev int64, from int) {
	t.Helper()
	rev, from = revision(t, ctx, cli), h.count()
	if err := syscall.Kill(h.pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// (a) Its own requests, under the election key and revision it led
	// with, are refused by etcd's comparison.
	for _, cmd := range []string{"read", "write"} {
		h.send(cmd)
		e := h.waitFor(from, 30*time.Second, "the deposed leader's "+cmd, is(cmd))
		if e.Key != old.Key || e.Rev != old.Rev {
			t.Fatalf("the deposed leader's %s was made under %s (rev %d), not the key it led with, %s (rev %d)", cmd, e.Key, e.Rev, old.Key, old.Rev)
		}
		if !e.Refused || !strings.Contains(e.Error, "refused by the fence") {
			t.Fatalf("the deposed leader's %s under its own old key %s (rev %d) was not refused by etcd: %s", cmd, e.Key, e.Rev, e.Error)
		}
		t.Logf("deposed %s refused: %s", cmd, e.Error)
	}
	// (b) It steps down: its lead ends with its leadership lost...
	e := h.waitFor(from, 30*time.Second, "the deposed leader to step down", is("stepped_down"))
	if e.Key != old.Key || !strings.Contains(e.Error, ErrLeadershipLost.Error()) {
		t.Fatalf("the deposed leader stepped down from %s with %q, want %s and its leadership lost", e.Key, e.Error, old.Key)
	}
	t.Logf("deposed leader stepped down: %s", e.Error)
	// ...and it campaigns again, behind the standby that leads now.
	waitUntil(t, 30*time.Second, id+" to campaign again behind "+standby, func() (bool, string) {
		kvs := electionKeys(t, ctx, cli, election)
		ok := len(kvs) == 2 && string(kvs[0].Value) == standby && string(kvs[1].Value) == id && kvs[1].CreateRevision > rev
		return ok, describe(kvs)
	})
	return rev, from
}

// TestDeposedCoordinatorIsFenced: coordinator A, in a process of its own,
// leads and decides; SIGSTOPped past its session TTL, its lease expires
// and standby B leads and decides a newcomer. SIGCONTed, A's read and
// write under its own old election key and revision are refused by etcd,
// it steps down and campaigns again behind B, and every generation
// written from then on is B's.
func TestDeposedCoordinatorIsFenced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := client(t)
	job := jobName("deposed")
	keys, err := KeysFor(job)
	if err != nil {
		t.Fatal(err)
	}
	gens := generations(t, ctx, cli, keys)
	alive, _ := addrs(t)
	register(t, cli, keys, "w1", alive)
	a := startHelper(t, helperSpec{Role: "coordinator", Endpoints: endpoints, Job: job, ID: "A", TTL: deposedTTL})
	lead := a.waitFor(0, time.Minute, "A to lead", is("leading"))
	if g := next(t, gens); g.DecidedBy != "A" || !slices.Equal(memberIDs(g), []string{"w1"}) {
		t.Fatalf("first generation %v decided by %q, want [w1] by A", memberIDs(g), g.DecidedBy)
	}
	bLead := make(chan Leadership, 8)
	b, err := New(NewJob(client(t), keys), Config{ID: "B", Rendezvous: Rendezvous{MinWorkers: 1, MaxWorkers: 8}, JoinWindow: time.Millisecond,
		SessionTTL: deposedTTL, OnLeadership: func(l Leadership) { bLead <- l }})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCancelled(t, ctx, b)
	waitUntil(t, 30*time.Second, "A leading with the key it reported, B campaigning behind it", func() (bool, string) {
		kvs := electionKeys(t, ctx, cli, keys.Election())
		return len(kvs) == 2 && string(kvs[0].Key) == lead.Key && kvs[0].CreateRevision == lead.Rev && string(kvs[1].Value) == "B", describe(kvs)
	})

	if err := syscall.Kill(a.pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(a.pid, syscall.SIGCONT) })
	register(t, cli, keys, "w2", alive) // for B to decide
	if l := recv(t, bLead, deposedTTL+time.Minute, "standby B to lead once A's session expired"); !l.Leading {
		t.Fatalf("B stepped down before leading: %v", l.Err)
	}
	if kvs := electionKeys(t, ctx, cli, keys.Election()); len(kvs) != 1 || string(kvs[0].Value) != "B" {
		t.Fatalf("B leads while the election holds %s, want B's key only", describe(kvs))
	}
	if g := next(t, gens); g.DecidedBy != "B" || !slices.Equal(memberIDs(g), []string{"w1", "w2"}) {
		t.Fatalf("generation %d %v decided by %q, want [w1 w2] by B", g.Number, memberIDs(g), g.DecidedBy)
	}

	rev, from := deposed(t, ctx, cli, a, "A", lead, keys.Election(), "B")
	register(t, cli, keys, "w3", alive) // a change for the leader to decide: B, never A
	if g := next(t, gens); g.DecidedBy != "B" || !slices.Equal(memberIDs(g), []string{"w1", "w2", "w3"}) {
		t.Fatalf("generation %d %v decided by %q, want [w1 w2 w3] by B", g.Number, memberIDs(g), g.DecidedBy)
	}
	written := versions(t, ctx, cli, keys.Generation(), rev)
	for _, kv := range written {
		g, err := DecodeGeneration(keys.Generation(), kv.Value)
		if err != nil || g.DecidedBy != "B" {
			t.Errorf("generation record of revision %d written after A was continued: %v decided by %q (%v), want B's", kv.ModRevision, g, g.GetDecidedBy(), err)
		}
	}
	if len(written) != 1 {
		t.Errorf("%d generation records written after A was continued, want B's one", len(written))
	}
	for _, e := range a.events(from) {
		if e.Event == "decided" || e.Event == "leading" {
			t.Errorf("the deposed coordinator, continued: %+v", e)
		}
	}
}

// TestDeposedShardMapWriterIsFenced: the shard-map writer A, in a process
// of its own, writes the first map; SIGSTOPped past its session TTL, its
// lease expires and standby B writes the map after a server's loss.
// SIGCONTed, A's read and write under its own old election key and
// revision are refused by etcd, it steps down and campaigns again behind
// B, and the one map written from then on is B's.
func TestDeposedShardMapWriterIsFenced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := client(t)
	job := jobName("deposed-map")
	keys, err := KeysFor(job)
	if err != nil {
		t.Fatal(err)
	}
	leases := map[string]*Lease{}
	for _, s := range servers("s0", "s1", "s2") {
		l, err := RegisterAt(ctx, cli, keys.PSServer(s.Id), s, testTTL)
		if err != nil {
			t.Fatal(err)
		}
		leases[s.Id] = l
	}
	a := startHelper(t, helperSpec{Role: "shardmap", Endpoints: endpoints, Job: job, ID: "A", TTL: deposedTTL, Servers: 3})
	lead := a.waitFor(0, time.Minute, "A to lead", is("leading"))
	a.waitFor(0, time.Minute, "A's first shard map", func(e helperEvent) bool { return e.Event == "map" && e.Generation == 1 })

	bLead, bMaps := make(chan Leadership, 8), make(chan *phalanxpb.ShardMap, 8)
	bctx, stopB := context.WithCancel(ctx)
	bDone := make(chan error, 1)
	bcli := client(t) // closed after B stops: B's session revokes its lease on the way out
	go func() {
		bDone <- NewJob(bcli, keys).RunShardMap(bctx, ShardMapConfig{ID: "B", Shards: 3, Replicas: 2, Servers: 3, SessionTTL: deposedTTL,
			OnLeadership: func(l Leadership) { bLead <- l }, OnMap: func(m *phalanxpb.ShardMap) { bMaps <- m }})
	}()
	t.Cleanup(func() {
		stopB()
		recv(t, bDone, 30*time.Second, "standby B's RunShardMap to return once cancelled")
	})
	waitUntil(t, 30*time.Second, "A writing the map with the key it reported, B campaigning behind it", func() (bool, string) {
		kvs := electionKeys(t, ctx, cli, keys.PSElection())
		return len(kvs) == 2 && string(kvs[0].Key) == lead.Key && kvs[0].CreateRevision == lead.Rev && string(kvs[1].Value) == "B", describe(kvs)
	})

	if err := syscall.Kill(a.pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(a.pid, syscall.SIGCONT) })
	if l := recv(t, bLead, deposedTTL+time.Minute, "standby B to lead once A's session expired"); !l.Leading {
		t.Fatalf("B stepped down before leading: %v", l.Err)
	}
	if err := leases["s0"].Close(ctx); err != nil { // s0 gone: for B to decide
		t.Fatal(err)
	}
	if m := recv(t, bMaps, 30*time.Second, "B's map without s0"); m.Generation != 2 || len(m.Failovers) != 1 {
		t.Fatalf("B's map: generation %d, failovers %v; want 2 with shard 0's failover", m.Generation, m.Failovers)
	}

	rev, from := deposed(t, ctx, cli, a, "A", lead, keys.PSElection(), "B")
	if err := leases["s1"].Close(ctx); err != nil { // a change for the writer to decide: B, never A
		t.Fatal(err)
	}
	m := recv(t, bMaps, 30*time.Second, "B's map without s0 and s1")
	want, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	written := versions(t, ctx, cli, keys.ShardMap(), rev)
	if len(written) != 1 || string(written[0].Value) != string(want) {
		t.Errorf("%d shard maps written after A was continued, want B's generation %d only", len(written), m.Generation)
	}
	for _, e := range a.events(from) {
		if e.Event == "map" || e.Event == "leading" {
			t.Errorf("the deposed shard-map writer, continued: %+v", e)
		}
	}
}
