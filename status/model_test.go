package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/testclock"
)

// feed is a job's events in order.
type feed []struct {
	event  string
	fields []events.Field
}

func ev(event string, kv ...any) struct {
	event  string
	fields []events.Field
} {
	var f []events.Field
	for i := 0; i+1 < len(kv); i += 2 {
		f = append(f, events.F(kv[i].(string), kv[i+1]))
	}
	return struct {
		event  string
		fields []events.Field
	}{event, f}
}

func members(pids ...int) []map[string]any {
	out := make([]map[string]any, len(pids))
	for i, p := range pids {
		out[i] = map[string]any{"rank": i, "id": "w-" + string(rune('a'+i)), "pid": p}
	}
	return out
}

// aJob: three workers, a ring, steps, a checkpoint, a straggler
// excluded and readmitted, a worker lost, a step trained again after the
// rollback, the job done.
func aJob() feed {
	return feed{
		ev("job_started", "job", "j1", "model", "mlp"),
		ev("worker_started", "worker", 0, "pid", 100, "role", "worker"),
		ev("worker_started", "worker", 1, "pid", 101, "role", "worker"),
		ev("worker_started", "worker", 2, "pid", 102, "role", "worker"),
		ev("generation", "generation", uint64(1), "members", members(100, 101, 102), "world", 3, "reason", "rendezvous"),
		ev("step", "step", int64(1), "generation", uint64(1), "loss", 2.0, "samples_per_s", 1000.0),
		ev("step", "step", int64(2), "generation", uint64(1), "loss", 1.5, "samples_per_s", 1100.0),
		ev("checkpoint_saved", "step", int64(2), "bytes", int64(4096), "seconds", 0.25, "url", "/ck/2", "checkpoint", "c2", "manifest_crc32c", uint32(0xabcd)),
		ev("step", "step", int64(3), "generation", uint64(1), "loss", 1.2, "samples_per_s", 1100.0),
		ev("generation", "generation", uint64(2), "members", members(100, 101), "world", 2, "reason", "straggler"),
		ev("straggler_excluded", "generation", uint64(2), "rank", 2, "pid", 102, "id", "w-c", "late_in", 5, "window", 10, "step", int64(3)),
		ev("step", "step", int64(4), "generation", uint64(2), "loss", 1.0, "samples_per_s", 900.0),
		ev("generation", "generation", uint64(3), "members", members(100, 101, 102), "world", 3, "reason", "readmitted"),
		ev("straggler_readmitted", "generation", uint64(3), "rank", 2, "pid", 102, "id", "w-c"),
		ev("step", "step", int64(5), "generation", uint64(3), "loss", 0.9, "samples_per_s", 1000.0),
		ev("generation", "generation", uint64(4), "members", members(100, 102), "world", 2, "reason", "lost rank 1"),
		ev("worker_lost", "generation", uint64(4), "rank", 1, "pid", 101, "id", "w-b", "detected_by", "lease expired"),
		ev("worker_exited", "worker", 1, "pid", 101, "status", "signal: killed"),
		ev("step", "step", int64(5), "generation", uint64(4), "loss", 0.95, "samples_per_s", 700.0), // trained again
		ev("step", "step", int64(6), "generation", uint64(4), "loss", 0.8, "samples_per_s", 700.0),
		ev("done", "step", int64(6)),
	}
}

// TestModel: the snapshot after a job's events says what happened.
func TestModel(t *testing.T) {
	clk := testclock.New(time.Unix(1000, 0))
	m := NewModel(Info{Job: "j1", Steps: 6}, clk.Now)
	var versions []uint64
	for _, e := range aJob() {
		m.Emit(e.event, e.fields...)
		_, v := m.Snapshot()
		versions = append(versions, v)
		clk.Advance(time.Second)
	}
	s, _ := m.Snapshot()
	for i := 1; i < len(versions); i++ {
		if versions[i] <= versions[i-1] {
			t.Fatalf("the version did not grow with event %d", i)
		}
	}
	checks := []struct {
		what      string
		got, want any
	}{
		{"state", s.State, "done"},
		{"generation", s.Generation, uint64(4)},
		{"world", s.World, 2},
		{"step", s.Step, int64(6)},
		{"ring", s.Ring, []Member{{0, "w-a", 100, 0}, {1, "w-b", 102, 2}}},
		{"generations", len(s.Generations), 4},
		{"lost in generation 4", s.Generations[3].Lost, []int{1}},
		{"excluded in generation 2", s.Generations[1].Excluded, []int{2}},
		{"readmitted in generation 3", s.Generations[2].Readmitted, []int{2}},
		{"excluded now", len(s.Excluded), 0},
		{"worker 1", s.Workers[1].State + " " + s.Workers[1].Exit, "exited signal: killed"},
		{"worker 2", s.Workers[2].State, "training"},
		{"worker 2's rank", s.Workers[2].Rank, 1},
		{"curve steps", steps(s.Curve), []int64{1, 2, 3, 4, 5, 6}},
		{"step 5's loss, trained again", s.Curve[4].Loss, 0.95},
		{"checkpoint", s.Checkpoints, []Checkpoint{{ID: "c2", Step: 2, Bytes: 4096, Seconds: 0.25, URL: "/ck/2",
			Verified: "manifest CRC32C 0000abcd", At: time.Unix(1007, 0)}}},
		{"marks", kinds(s.Marks), []string{"generation", "checkpoint", "generation", "excluded", "generation", "readmitted", "generation", "lost"}},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	// The table names what the snapshot holds.
	var b bytes.Buffer
	if err := WriteTable(&b, s, clk.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"job j1 (mlp): done · generation 4 · world 2 · step 6/6", "RING", "GENERATIONS",
		"lost rank 1", "exited (signal: killed)", "manifest CRC32C 0000abcd", "LAST EVENTS", "worker_lost"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, b.String())
		}
	}
}

func steps(c []Point) []int64 {
	var out []int64
	for _, p := range c {
		out = append(out, p.Step)
	}
	return out
}

func kinds(ms []Mark) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Kind)
	}
	return out
}

// TestLongJobStaysBounded: a job of many steps keeps its whole curve at a
// coarser grain and its recent steps whole, and bounded lists.
func TestLongJobStaysBounded(t *testing.T) {
	m := NewModel(Info{Job: "long"}, nil)
	const n = 100000
	for i := int64(1); i <= n; i++ {
		m.Emit("step", events.F("step", i), events.F("loss", 1/float64(i)), events.F("generation", uint64(1)))
	}
	for i := range 1000 {
		m.Emit("checkpoint_saved", events.F("step", int64(i)), events.F("checkpoint", "c"+string(rune(i))))
	}
	s, _ := m.Snapshot()
	if len(s.Curve) > maxPoints || s.Curve[0].Step != 1 || s.Curve[len(s.Curve)-1].Step != n {
		t.Errorf("the curve holds %d points from step %d to %d: want at most %d, from 1 to %d", len(s.Curve), s.Curve[0].Step,
			s.Curve[len(s.Curve)-1].Step, maxPoints, n)
	}
	for i := 1; i < len(s.Curve); i++ {
		if s.Curve[i].Step <= s.Curve[i-1].Step {
			t.Fatalf("the curve's steps go back at %d", i)
		}
	}
	if last := s.Curve[len(s.Curve)-maxPoints/4:]; last[0].Step != n-int64(len(last))+1 {
		t.Errorf("the last %d steps are not whole: they start at %d", len(last), last[0].Step)
	}
	if len(s.Checkpoints) > maxCheckpoints || len(s.Events) > maxEvents || len(s.Marks) > maxMarks {
		t.Errorf("lists grew: %d checkpoints, %d events, %d marks", len(s.Checkpoints), len(s.Events), len(s.Marks))
	}
	tr := s.Trimmed()
	b, _ := json.Marshal(tr)
	if len(b) > 64<<10 {
		t.Errorf("the published snapshot is %d bytes: want it small", len(b))
	}
}

// TestFetch: a published status is read back from a real etcd; a job
// that published none and has no generation is ErrNoJob.
func TestFetch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := coordinator.Connect(e.Endpoints(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	keys, _ := coordinator.KeysFor("j1")
	job := coordinator.NewJob(cli, keys)
	if _, err := Fetch(ctx, job); !errors.Is(err, ErrNoJob) {
		t.Fatalf("Fetch of a job never seen: %v, want ErrNoJob", err)
	}
	m := NewModel(Info{Job: "j1"}, nil)
	for _, e := range aJob() {
		m.Emit(e.event, e.fields...)
	}
	s, _ := m.Snapshot()
	b, _ := json.Marshal(s.Trimmed())
	if err := job.PublishStatus(ctx, b); err != nil {
		t.Fatal(err)
	}
	got, err := Fetch(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	want := s.Trimmed()
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if !bytes.Equal(gb, wb) {
		t.Errorf("Fetch read\n%s\nwant\n%s", gb, wb)
	}
	if err := job.PublishStatus(ctx, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := Fetch(ctx, job); err == nil || !strings.Contains(err.Error(), "not a snapshot") {
		t.Errorf("Fetch of garbage: %v, want an error saying it is not a snapshot", err)
	}
}
