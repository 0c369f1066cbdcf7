package psjob

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/internal/testclock"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
	"github.com/phalanx-rt/phalanx/ps/cluster"
)

// TestSharesToTake: a worker claims the shares whose worker died (claimed
// once, claim gone, not done), and those nobody ever claimed only after the
// grace; never a share it runs, one claimed, or one done.
func TestSharesToTake(t *testing.T) {
	claim := func(shares ...int) map[int]coordinator.PSShareClaim {
		m := map[int]coordinator.PSShareClaim{}
		for _, s := range shares {
			m[s] = coordinator.PSShareClaim{Share: s}
		}
		return m
	}
	seen := func(shares ...int) map[int]bool {
		m := map[int]bool{}
		for _, s := range shares {
			m[s] = true
		}
		return m
	}
	done := func(shares ...int) map[int]coordinator.PSShareDone {
		m := map[int]coordinator.PSShareDone{}
		for _, s := range shares {
			m[s] = coordinator.PSShareDone{Share: s}
		}
		return m
	}
	cases := []struct {
		name    string
		table   coordinator.PSShares
		running map[int]bool
		grace   bool
		want    []int
	}{
		{"all claimed", coordinator.PSShares{Claims: claim(0, 1, 2), Seen: seen(0, 1, 2), Done: done()}, seen(0), false, nil},
		{"one died", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 1, 2), Done: done()}, seen(0), false, []int{1}},
		{"one died after its share was done", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 1, 2), Done: done(1)}, seen(0), false, nil},
		{"not started yet", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 2), Done: done()}, seen(0), false, nil},
		{"never started, grace over", coordinator.PSShares{Claims: claim(0, 2), Seen: seen(0, 2), Done: done()}, seen(0), true, []int{1}},
		{"this worker's own, between claim and run", coordinator.PSShares{Claims: claim(2), Seen: seen(0, 2), Done: done()}, seen(0), false, nil},
		{"two died", coordinator.PSShares{Claims: claim(0), Seen: seen(0, 1, 2), Done: done()}, seen(0), false, []int{1, 2}},
	}
	for _, tc := range cases {
		if got := sharesToTake(tc.table, 3, tc.running, tc.grace); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestExactlyOnce: a shard's account is exactly once when every share's
// steps base+1..steps were applied once each: not with a step short, one
// over, or a step lost beside another applied twice (the count even); never
// under asp.
func TestExactlyOnce(t *testing.T) {
	const steps = 10
	once := ps.PushCounts{Last: steps, Applied: steps}
	for _, tc := range []struct {
		name string
		mode ps.Mode
		p    ps.PushCounts
		want bool
	}{
		{"every step once", ps.BSP, once, true},
		{"from a restore", ps.SSP, ps.PushCounts{Last: steps, Applied: steps - 4, Base: 4}, true},
		{"a step short", ps.BSP, ps.PushCounts{Last: steps, Applied: steps - 1, Skipped: 5}, false},
		{"a step twice", ps.BSP, ps.PushCounts{Last: steps, Applied: steps + 1, Again: 5}, false},
		{"lost and twice, the count even", ps.BSP, ps.PushCounts{Last: steps, Applied: steps, Again: 7, Skipped: 3}, false},
		{"the last step missing", ps.BSP, ps.PushCounts{Last: steps - 1, Applied: steps - 1}, false},
		{"asp", ps.ASP, once, false},
	} {
		a := psShardAccount{Info: ps.ShardInfo{Pushes: []ps.PushCounts{once, tc.p}}}
		if got := a.exactlyOnce(tc.mode, steps); got != tc.want {
			t.Errorf("%s: exactly once %v, want %v (%+v)", tc.name, got, tc.want, tc.p)
		}
	}
}

// printed is what a worker printed (job.ReportLines) for its launcher.
type printed struct{ bytes.Buffer }

// matches checks the printed lines, one per want, each holding every key
// of its want (JSON text) with the same value.
func (p *printed) matches(t *testing.T, want []string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(p.String()), "\n")
	if p.Len() == 0 {
		lines = nil
	}
	if len(lines) != len(want) {
		t.Fatalf("%d reports printed, want %d:\n%s", len(lines), len(want), p.String())
	}
	for i, w := range want {
		var got, exp map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &got); err != nil {
			t.Fatalf("report %d %q: %v", i, lines[i], err)
		}
		if err := json.Unmarshal([]byte(w), &exp); err != nil {
			t.Fatalf("want %d %q: %v", i, w, err)
		}
		for k, v := range exp {
			if !reflect.DeepEqual(got[k], v) {
				t.Errorf("report %d: %s is %v, want %v (%s)", i, k, got[k], v, lines[i])
			}
		}
	}
}

// testWorker is a worker of a bsp job of 2 workers, batch 4 each, 4
// steps, reporting every `every` steps, with a clock moved by hand.
func testWorker(every uint32, out *printed, c *testclock.Manual) *psWorkerProc {
	return &psWorkerProc{job: &phalanxpb.PSJob{Workers: 2, Batch: 4, Steps: 4, ReportEvery: every, Tables: []*phalanxpb.PSTable{{Id: 1}}},
		spec: cluster.Spec{Sync: ps.SyncSpec{Mode: ps.BSP}}, cfg: job.Config{Now: c.Now}, rep: job.NewReporter(job.ReportLines(out)), index: 1}
}

// TestStepper: share 0 reports progress (ps_step) every ReportEvery steps
// and at the last one (every twentieth of the job's steps, at least 1, by
// default): the mean loss, the stale pushes and the examples per second
// since its last report; another share reports nothing.
func TestStepper(t *testing.T) {
	cases := []struct {
		name  string
		share int
		every uint32
		want  []string
	}{
		{"share 0, every 2 steps", 0, 2, []string{
			`{"kind":"ps_step","step":2,"steps":4,"epoch":0,"loss":1.5,"samples_per_s":8,"stale":1}`,
			`{"kind":"ps_step","step":4,"steps":4,"epoch":1,"loss":3.5,"samples_per_s":8,"stale":5}`}},
		{"share 0, every 3 steps and the last", 0, 3, []string{
			`{"kind":"ps_step","step":3,"steps":4,"epoch":1,"loss":2,"samples_per_s":8,"stale":3}`,
			`{"kind":"ps_step","step":4,"steps":4,"epoch":1,"loss":4,"samples_per_s":8,"stale":3}`}},
		{"share 0, by default every step", 0, 0, []string{
			`{"kind":"ps_step","step":1,"loss":1,"samples_per_s":8}`, `{"kind":"ps_step","step":2,"loss":2,"stale":1}`,
			`{"kind":"ps_step","step":3,"loss":3,"stale":2}`, `{"kind":"ps_step","step":4,"loss":4,"stale":3}`}},
		{"another share", 1, 1, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out printed
			c := testclock.New(time.Unix(1000, 0))
			step := testWorker(tc.every, &out, c).stepper(tc.share, 0, nil)
			ctx := testwait.Context(t, time.Minute)
			for i := range int64(4) {
				c.Advance(time.Second) // a second a step: 2 workers × 4 examples
				if err := step(ctx, i+1, int(i/2), float64(i+1), int(i)); err != nil {
					t.Fatalf("step %d: %v", i+1, err)
				}
			}
			out.matches(t, tc.want)
		})
	}
}

// TestShareDone: share 0 reports the job's end (ps_done, with the held-out
// metrics) before its share's (ps_share_done); another share only its own,
// with the pushes the shards answered as duplicates.
func TestShareDone(t *testing.T) {
	cases := []struct {
		name   string
		share  int
		reason string
		want   []string
	}{
		{"share 0", 0, "own", []string{`{"kind":"ps_done","steps":4,"metrics":{"loss":0.2}}`,
			`{"kind":"ps_share_done","worker":1,"share":0,"steps":4,"reason":"own","from":0,"replayed_to":0,"duplicates":0}`}},
		{"a share taken over", 2, "adopted", []string{
			`{"kind":"ps_share_done","worker":1,"share":2,"steps":4,"reason":"adopted","from":1,"replayed_to":3,"duplicates":2}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out printed
			w := testWorker(1, &out, testclock.New(time.Unix(1000, 0)))
			from, replayedTo, dups := int64(0), int64(0), int64(0)
			if tc.share != 0 {
				from, replayedTo, dups = 1, 3, 2
			}
			w.shareDone(tc.share, tc.reason, from, replayedTo, map[string]float64{"loss": 0.2}, dups)
			out.matches(t, tc.want)
		})
	}
}

// TestWorkerToLauncher: what a worker prints, its launcher reads: share
// 0's progress and end, and a share's end, become the job's events.
func TestWorkerToLauncher(t *testing.T) {
	var out printed
	c := testclock.New(time.Unix(1000, 0))
	w := testWorker(2, &out, c)
	step := w.stepper(0, 0, nil)
	ctx := testwait.Context(t, time.Minute)
	for i := range int64(4) {
		c.Advance(time.Second)
		if err := step(ctx, i+1, 0, 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	w.shareDone(0, "own", 0, 0, map[string]float64{"loss": 0.5}, 0)
	p := newTestLaunch()
	s := p.run()
	for _, text := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		p.line(s, worker(1, text))
	}
	if s.done == nil {
		t.Fatal("the job's end not kept")
	}
	p.reportDone(s.done, nil, s.start)
	want := fmt.Sprintf("step step=2 worker=0 epoch=0 loss=1 samples_per_s=8 stale=0\nstep step=4 worker=0 epoch=0 loss=1 samples_per_s=8 stale=0\n"+
		"ps_share_done share=0 worker=1 pid=%d reason=own from=0 replayed_to=0 steps=4 duplicates=0\ndone steps=4 shards=[] loss=0.5", os.Getpid())
	if got := p.events.text(); got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
}
