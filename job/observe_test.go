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
