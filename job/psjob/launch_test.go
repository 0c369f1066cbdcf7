package psjob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/internal/testclock"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// The report lines below are as a worker prints them (job.ReportLines):
// the launcher reads the JSON wire (job.MarshalReport), as from a process.
const (
	stepLine = `{"kind":"ps_step","worker":0,"step":10,"steps":10,"epoch":1,"loss":0.25,"samples_per_s":800,"stale":2}`
	midLine  = `{"kind":"ps_step","worker":0,"step":5,"steps":10,"epoch":1,"loss":0.5,"samples_per_s":800,"stale":0}`
	ckptLine = `{"kind":"ps_checkpoint","step":10,"steps":10,"shards":2}`
	doneLine = `{"kind":"ps_done","steps":10,"metrics":{"accuracy":0.9,"loss":0.2}}`
	ownLine  = `{"kind":"ps_share","worker":0,"pid":100,"share":0,"steps":10,"reason":"own","from":0,"replayed_to":0}`
	tookLine = `{"kind":"ps_share","worker":1,"pid":101,"share":2,"steps":10,"reason":"adopted","from":4,"replayed_to":6}`
	shDLine  = `{"kind":"ps_share_done","worker":1,"pid":101,"share":2,"steps":10,"reason":"adopted","from":4,"replayed_to":6,"duplicates":3}`
	failLine = `{"kind":"failed","reason":"out of memory"}`
)

// recorder records events as "name key=value ..." lines.
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) Emit(event string, fields ...events.Field) error {
	parts := []string{event}
	for _, f := range fields {
		parts = append(parts, fmt.Sprintf("%s=%v", f.Key, f.Value))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, strings.Join(parts, " "))
	return nil
}

func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.lines, "\n")
}

// testLaunch is a launcher of a job of two workers and two servers with no
// processes: its events, Output and warnings are recorded.
type testLaunch struct {
	*psLaunch
	events *recorder
	out    *bytes.Buffer
	logs   *observer.ObservedLogs
	clock  *testclock.Manual
}

func newTestLaunch() *testLaunch {
	lc := job.DefaultLaunchConfig()
	lc.Job, lc.Workers = "j1", 2
	core, logs := observer.New(zapcore.WarnLevel)
	t := &testLaunch{events: &recorder{}, out: &bytes.Buffer{}, logs: logs, clock: testclock.New(time.Unix(1000, 0))}
	t.psLaunch = &psLaunch{Env: &job.Env{LC: &lc, Endpoints: []string{"127.0.0.1:2379"}, Log: zap.New(core), Events: t.events, Out: t.out},
		rec: &phalanxpb.PSJob{Model: "lr", Servers: 2, Shards: 4, Replicas: 1, Partition: "range", Consistency: "bsp", Workers: 2, Steps: 10}, now: t.clock.Now, types: reportTypes()}
	return t
}

func (t *testLaunch) run() *psRun {
	return &psRun{start: t.now(), running: t.LC.Workers, failures: map[int]string{}}
}

func worker(index int, text string) launch.Line {
	return launch.Line{Role: "ps-worker", Index: index, Text: []byte(text)}
}

// TestTake: each report line a worker prints becomes its events and
// progress lines; the job's end and a failure's reason are kept; a line
// that is no report is passed on naming its worker; a server's lines and a
// kind it does not follow are ignored.
func TestTake(t *testing.T) {
	cases := []struct {
		name     string
		line     launch.Line
		events   []string
		out      string // a regular expression
		done     bool
		failures map[int]string
	}{
		{name: "the last step", line: worker(0, stepLine),
			events: []string{"step step=10 worker=0 epoch=1 loss=0.25 samples_per_s=800 stale=2"},
			out:    regexp.QuoteMeta("step     10/10  epoch 1  loss 0.2500       800 examples/s  ETA 0s\n")},
		{name: "a step midway", line: worker(0, midLine),
			events: []string{"step step=5 worker=0 epoch=1 loss=0.5 samples_per_s=800 stale=0"},
			out:    regexp.QuoteMeta("step      5/10  epoch 1  loss 0.5000       800 examples/s  ETA ") + `\d+s\n`},
		{name: "a checkpoint", line: worker(0, ckptLine),
			events: []string{"checkpoint_saved step=10 shards=2"}, out: regexp.QuoteMeta("checkpoint of step 10 saved (2 shards)\n")},
		{name: "the job's end", line: worker(0, doneLine), done: true},
		{name: "a worker's own share", line: worker(0, ownLine),
			events: []string{"ps_share share=0 worker=0 pid=100 reason=own from=0 replayed_to=0"}},
		{name: "a share taken over", line: worker(1, tookLine),
			events: []string{"ps_share share=2 worker=1 pid=101 reason=adopted from=4 replayed_to=6"},
			out:    regexp.QuoteMeta("worker 1 took over share 2 at step 4\n")},
		{name: "a share done", line: worker(1, shDLine),
			events: []string{"ps_share_done share=2 worker=1 pid=101 reason=adopted from=4 replayed_to=6 steps=10 duplicates=3"}},
		{name: "a failure's reason", line: worker(1, failLine), failures: map[int]string{1: "out of memory"}},
		{name: "garbage on a worker's stdout", line: worker(2, "hello there"), out: regexp.QuoteMeta("worker 2: hello there\n")},
		{name: "a server's line", line: launch.Line{Role: "ps-server", Index: 0, Text: []byte(stepLine)}},
		{name: "a kind the launcher does not follow", line: worker(0, `{"kind":"registered","id":"w0","pid":100}`)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLaunch()
			s := p.run()
			p.line(s, tc.line)
			if got, want := p.events.text(), strings.Join(tc.events, "\n"); got != want {
				t.Errorf("events\n%s\nwant\n%s", got, want)
			}
			if !regexp.MustCompile(`^` + tc.out + `$`).MatchString(p.out.String()) {
				t.Errorf("output %q, want /%s/", p.out.String(), tc.out)
			}
			if (s.done != nil) != tc.done {
				t.Errorf("the job's end kept: %v, want %v", s.done != nil, tc.done)
			}
			if want := tc.failures; !maps.Equal(s.failures, want) {
				t.Errorf("failures %v, want %v", s.failures, want)
			}
		})
	}
}

// TestExited: a worker's exit is one fewer running; a non-zero one is a
// lost worker (ps_worker_lost, a line of Output) whose reason is the one
// it reported, else its exit status, the first failure kept as the job's;
// a server's exit leaves the workers' count and is warned of. A child's
// lines all come before its exit: those not yet taken are, first.
func TestExited(t *testing.T) {
	cases := []struct {
		name     string
		failures map[int]string
		pending  []launch.Line // written before the exit, not yet taken
		failed   error         // an earlier failure
		exit     launch.Exit
		running  int
		events   []string
		out      string
		failure  string // the job's failure after: "" none
		warned   bool
	}{
		{name: "a worker's clean exit", exit: launch.Exit{Role: "ps-worker", Index: 0, Pid: 100}, running: 1,
			events: []string{"worker_exited worker=0 pid=100 role=worker status=exit 0"}},
		{name: "a worker fails, having said why", failures: map[int]string{1: "out of memory"},
			exit: launch.Exit{Role: "ps-worker", Index: 1, Pid: 101, Err: errors.New("exit status 1")}, running: 1,
			events: []string{"ps_worker_lost worker=1 pid=101 status=exit status 1 reason=out of memory workers_left=1",
				"worker_exited worker=1 pid=101 role=worker status=exit status 1"},
			out: "worker 1 (pid 101) lost: out of memory; 1 workers left\n", failure: "worker 1 (pid 101) failed: out of memory"},
		{name: "a worker fails, its last word not yet taken", pending: []launch.Line{worker(1, failLine)},
			exit: launch.Exit{Role: "ps-worker", Index: 1, Pid: 101, Err: errors.New("exit status 1")}, running: 1,
			events: []string{"ps_worker_lost worker=1 pid=101 status=exit status 1 reason=out of memory workers_left=1",
				"worker_exited worker=1 pid=101 role=worker status=exit status 1"},
			out: "worker 1 (pid 101) lost: out of memory; 1 workers left\n", failure: "worker 1 (pid 101) failed: out of memory"},
		{name: "a worker fails silently", failures: map[int]string{0: "another worker's reason"},
			exit: launch.Exit{Role: "ps-worker", Index: 1, Pid: 101, Err: errors.New("exit status 2")}, running: 1,
			events: []string{"ps_worker_lost worker=1 pid=101 status=exit status 2 reason=exit status 2 workers_left=1",
				"worker_exited worker=1 pid=101 role=worker status=exit status 2"},
			out: "worker 1 (pid 101) lost: exit status 2; 1 workers left\n", failure: "worker 1 (pid 101) failed: exit status 2"},
		{name: "a second failure keeps the first", failed: errors.New("worker 0 (pid 100) failed: first"),
			exit: launch.Exit{Role: "ps-worker", Index: 1, Pid: 101, Err: errors.New("exit status 1")}, running: 1,
			events: []string{"ps_worker_lost worker=1 pid=101 status=exit status 1 reason=exit status 1 workers_left=1",
				"worker_exited worker=1 pid=101 role=worker status=exit status 1"},
			out: "worker 1 (pid 101) lost: exit status 1; 1 workers left\n", failure: "worker 0 (pid 100) failed: first"},
		{name: "a server ends", exit: launch.Exit{Role: "ps-server", Index: 1, Pid: 201, Err: errors.New("exit status 1")}, running: 2,
			events: []string{"worker_exited worker=1 pid=201 role=ps status=exit status 1"}, warned: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLaunch()
			s := p.run()
			maps.Copy(s.failures, tc.failures)
			s.failed = tc.failed
			lines := make(chan launch.Line, len(tc.pending))
			for _, l := range tc.pending {
				lines <- l
			}
			s.lines = lines
			p.exited(s, tc.exit)
			if s.running != tc.running {
				t.Errorf("%d workers running, want %d", s.running, tc.running)
			}
			if got, want := p.events.text(), strings.Join(tc.events, "\n"); got != want {
				t.Errorf("events\n%s\nwant\n%s", got, want)
			}
			if p.out.String() != tc.out {
				t.Errorf("output %q, want %q", p.out.String(), tc.out)
			}
			if got := fmt.Sprint(s.failed); (s.failed != nil || tc.failure != "") && got != tc.failure {
				t.Errorf("the job's failure %q, want %q", got, tc.failure)
			}
			warned := p.logs.FilterMessage("a parameter server ended").Len() == 1
			if warned != tc.warned {
				t.Errorf("a server's end warned of: %v, want %v (%v)", warned, tc.warned, p.logs.All())
			}
		})
	}
}

// The event loop's inputs, fed one at a time.
type (
	mapEnd     struct{ err error }
	cancelWith struct{ err error }
)

// feed hands v to the event loop on ch, failing the test if it does not
// take it.
func feed[T any](t *testing.T, ch chan<- T, v T, what string) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case ch <- v:
	case <-timer.C:
		t.Fatalf("waited 10s for the event loop to take %s", what)
	}
}

// TestLoop: the event loop follows the shard maps, the workers' lines and
// exits until every worker has exited, and the job's end is decided: done
// if a worker reported it (a lost worker's shares finished by the others),
// else the first worker's failure, else an error; a shard map writer's
// failure or the job's cancellation end the loop with their error.
func TestLoop(t *testing.T) {
	errBoom, errStop := errors.New("boom"), errors.New("stopped by the operator")
	exit0 := launch.Exit{Role: "ps-worker", Index: 0, Pid: 100}
	exit1 := launch.Exit{Role: "ps-worker", Index: 1, Pid: 101}
	lost1 := launch.Exit{Role: "ps-worker", Index: 1, Pid: 101, Err: errors.New("exit status 1")}
	cases := []struct {
		name    string
		in      []any
		loopErr error  // the loop's end: nil, or an error it wraps
		endErr  string // the job's end decided: "" done
		events  []string
		out     string
	}{
		{name: "the job done", in: []any{worker(0, ownLine), worker(0, stepLine), worker(0, doneLine), exit0, exit1},
			events: []string{"ps_share share=0 worker=0 pid=100 reason=own from=0 replayed_to=0",
				"step step=10 worker=0 epoch=1 loss=0.25 samples_per_s=800 stale=2",
				"worker_exited worker=0 pid=100 role=worker status=exit 0", "worker_exited worker=1 pid=101 role=worker status=exit 0",
				"done steps=10 shards=[] accuracy=0.9 loss=0.2"},
			out: "step     10/10  epoch 1  loss 0.2500       800 examples/s  ETA 0s\ndone: 10 steps in 1.5s; held-out accuracy 0.9000, loss 0.2000\n"},
		{name: "a worker lost, the other finishing", in: []any{worker(1, failLine), lost1, worker(0, doneLine), exit0},
			events: []string{"ps_worker_lost worker=1 pid=101 status=exit status 1 reason=out of memory workers_left=1",
				"worker_exited worker=1 pid=101 role=worker status=exit status 1", "worker_exited worker=0 pid=100 role=worker status=exit 0",
				"done steps=10 shards=[] accuracy=0.9 loss=0.2"},
			out: "worker 1 (pid 101) lost: out of memory; 1 workers left\ndone: 10 steps in 1.5s; held-out accuracy 0.9000, loss 0.2000\n"},
		{name: "every worker failed", in: []any{worker(1, failLine), lost1, launch.Exit{Role: "ps-worker", Index: 0, Pid: 100, Err: errors.New("exit status 2")}},
			endErr: "worker 1 (pid 101) failed: out of memory",
			events: []string{"ps_worker_lost worker=1 pid=101 status=exit status 1 reason=out of memory workers_left=1",
				"worker_exited worker=1 pid=101 role=worker status=exit status 1",
				"ps_worker_lost worker=0 pid=100 status=exit status 2 reason=exit status 2 workers_left=0",
				"worker_exited worker=0 pid=100 role=worker status=exit status 2"},
			out: "worker 1 (pid 101) lost: out of memory; 1 workers left\nworker 0 (pid 100) lost: exit status 2; 0 workers left\n"},
		{name: "nobody reported the end", in: []any{exit0, exit1}, endErr: "phalanx: every worker ended and none reported the job done",
			events: []string{"worker_exited worker=0 pid=100 role=worker status=exit 0", "worker_exited worker=1 pid=101 role=worker status=exit 0"}},
		{name: "a shard map and a failover", in: []any{&phalanxpb.ShardMap{Generation: 2, Reason: "server lost",
			Shards:    []*phalanxpb.ShardPlacement{{Shard: 1, Primary: "b"}},
			Servers:   []*phalanxpb.PSServer{{Id: "b", Pid: 201, Addr: "127.0.0.1:1"}},
			Failovers: []*phalanxpb.Failover{{Shard: 1, Old: "a", New: "b"}}}, exit0, exit1},
			endErr: "phalanx: every worker ended and none reported the job done",
			events: []string{"ps_shard_map generation=2 shards=[map[backups:[] primary:b shard:1]] servers=[map[addr:127.0.0.1:1 id:b pid:201]] reason=server lost",
				"ps_failover generation=2 shard=1 old=a new=b",
				"worker_exited worker=0 pid=100 role=worker status=exit 0", "worker_exited worker=1 pid=101 role=worker status=exit 0"},
			out: "shard map 2: server lost\n  shard 1: b took over from a\n"},
		{name: "the shard map's writer ends", in: []any{mapEnd{nil}, exit0, exit1}, endErr: "phalanx: every worker ended and none reported the job done",
			events: []string{"worker_exited worker=0 pid=100 role=worker status=exit 0", "worker_exited worker=1 pid=101 role=worker status=exit 0"}},
		{name: "the shard map's writer fails", in: []any{worker(0, stepLine), mapEnd{errBoom}}, loopErr: errBoom,
			events: []string{"step step=10 worker=0 epoch=1 loss=0.25 samples_per_s=800 stale=2"},
			out:    "step     10/10  epoch 1  loss 0.2500       800 examples/s  ETA 0s\n"},
		{name: "the job cancelled", in: []any{exit0, cancelWith{errStop}}, loopErr: errStop,
			events: []string{"worker_exited worker=0 pid=100 role=worker status=exit 0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestLaunch()
			ctx, cancel := context.WithCancelCause(testwait.Context(t, time.Minute))
			defer cancel(nil)
			mapCh, mapDone := make(chan *phalanxpb.ShardMap), make(chan error)
			lines, exits := make(chan launch.Line), make(chan launch.Exit)
			s := p.run()
			s.maps, s.mapDone, s.lines, s.exits = mapCh, mapDone, lines, exits
			ended := make(chan error, 1)
			go func() { ended <- p.loop(ctx, s) }()
			for _, in := range tc.in {
				switch v := in.(type) {
				case launch.Line:
					feed(t, lines, v, "a line")
				case launch.Exit:
					feed(t, exits, v, "an exit")
				case *phalanxpb.ShardMap:
					feed(t, mapCh, v, "a shard map")
				case mapEnd:
					feed(t, mapDone, v.err, "the shard map's end")
				case cancelWith:
					cancel(v.err)
				}
			}
			err := testwait.Recv(t, ended, 10*time.Second, "the event loop's end")
			switch {
			case tc.loopErr == nil && err != nil:
				t.Fatalf("the loop ended with %v", err)
			case tc.loopErr != nil && !errors.Is(err, tc.loopErr):
				t.Fatalf("the loop ended with %v, want %v", err, tc.loopErr)
			case tc.loopErr == nil:
				p.drain(s)
				done, err := s.end()
				switch {
				case tc.endErr == "" && err != nil:
					t.Fatalf("the job's end: %v", err)
				case tc.endErr != "" && (err == nil || err.Error() != tc.endErr):
					t.Fatalf("the job's end: %v, want %s", err, tc.endErr)
				case err == nil:
					p.clock.Advance(s.start.Add(1500 * time.Millisecond).Sub(p.clock.Now()))
					p.reportDone(done, nil, s.start)
				}
			}
			if got, want := p.events.text(), strings.Join(tc.events, "\n"); got != want {
				t.Errorf("events\n%s\nwant\n%s", got, want)
			}
			if p.out.String() != tc.out {
				t.Errorf("output %q, want %q", p.out.String(), tc.out)
			}
		})
	}
}

// TestAnnounce: the job's start is told in job_started and a line of
// Output.
func TestAnnounce(t *testing.T) {
	p := newTestLaunch()
	p.announce()
	want := "job_started job=j1 etcd_endpoints=127.0.0.1:2379 workers=2 ps_servers=2 ps_shards=4 ps_replicas=1 consistency=bsp model=lr"
	if got := p.events.text(); got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
	if want := "phalanx: lr on 2 workers and 2 parameter servers (4 shards, 1 backups each, range, bsp); job j1, etcd 127.0.0.1:2379\n"; p.out.String() != want {
		t.Errorf("output %q, want %q", p.out.String(), want)
	}
}

// TestDrain: the lines already written when the last worker exited are
// taken: the job's end among them.
func TestDrain(t *testing.T) {
	p := newTestLaunch()
	s := p.run()
	lines := make(chan launch.Line, 2)
	lines <- worker(0, stepLine)
	lines <- worker(0, doneLine)
	s.lines = lines
	p.drain(s)
	if want := "step step=10 worker=0 epoch=1 loss=0.25 samples_per_s=800 stale=2"; p.events.text() != want {
		t.Errorf("events\n%s\nwant\n%s", p.events.text(), want)
	}
	if s.done == nil || len(lines) != 0 {
		t.Errorf("the job's end kept: %v, %d lines left; want true, 0", s.done != nil, len(lines))
	}
}
