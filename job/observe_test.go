package job

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/metrics"
	"github.com/phalanx-rt/phalanx/trace"
)

// TestObserversAllocateNothing: a collective operation's end, told to a
// process's metrics and trace, allocates nothing once their series and
// buffer exist: a step's bucket allreduces stay free of garbage.
func TestObserversAllocateNothing(t *testing.T) {
	r, err := trace.Create(filepath.Join(t.TempDir(), "w.jsonl"), "worker-0")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c := Config{Job: "j", Observe: metrics.New("j", "worker-0", metrics.Worker), Tracer: r}
	obs := c.Observer()
	start := time.Now()
	rec := &collective.OpRecord{Op: "allreduce", Group: "j", Seq: 1, Generation: 1, World: 2, Bytes: 1 << 20, Algorithm: "ring",
		Plane: "tcp", State: "done", Start: start, End: start.Add(time.Millisecond)}
	obs.OpEnded(rec) // the series and the buffer, once
	if n := testing.AllocsPerRun(100, func() {
		rec.Seq++
		obs.OpEnded(rec)
	}); n != 0 {
		t.Errorf("%v allocations per operation, want 0", n)
	}
}

// BenchmarkObserveStep is what watching a ring step costs its rank: a
// step's worth of observations with --metrics and --trace on (four
// bucket allreduces told to the metrics and the trace, the four spans of
// the step, the step's metrics, the flush of the trace). Set against the
// step's time (bench/observability.sh measures it), it bounds the
// overhead.
func BenchmarkObserveStep(b *testing.B) {
	r, err := trace.Create(filepath.Join(b.TempDir(), "w.jsonl"), "worker-0")
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	m := metrics.New("j", "worker-0", metrics.Worker)
	c := Config{Job: "j", Observe: m, Tracer: r}
	obs := c.Observer()
	start := time.Now()
	rec := &collective.OpRecord{Op: "allreduce", Group: "j", Generation: 1, World: 4, Bytes: 1 << 20, Algorithm: "ring",
		Plane: "tcp", State: "done", Start: start, End: start.Add(time.Millisecond)}
	b.ReportAllocs()
	for i := range b.N {
		for range 4 {
			rec.Seq++
			obs.OpEnded(rec)
		}
		for _, span := range []string{"forward/backward", "wait for the reduction", "optimizer"} {
			r.Span(trace.ThreadStep, span, start, start.Add(time.Millisecond), trace.Args{Step: int64(i), Rank: -1})
		}
		m.Step(-1, int64(i), 15*time.Millisecond, 64, 0.5)
		r.Flush()
	}
}
