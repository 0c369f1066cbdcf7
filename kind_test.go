package phalanx_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/events"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// generation is a generation event's world and members' pids.
type generation struct {
	world int
	pids  []int
}

// kindEvents records a barrier job's events for TestThirdKind.
type kindEvents struct {
	started
	mu2      sync.Mutex
	steps    chan int // step events' worlds (some dropped)
	worlds   chan generation
	pidOf    map[int]int // worker index -> pid
	exited   map[int]string
	exits    chan int // the pids of worker_exited events (some dropped)
	lastStep int64
}

func (k *kindEvents) Emit(event string, fields ...events.Field) error {
	k.started.Emit(event, fields...)
	f := map[string]any{}
	for _, fl := range fields {
		f[fl.Key] = fl.Value
	}
	k.mu2.Lock()
	defer k.mu2.Unlock()
	switch event {
	case "worker_started":
		k.pidOf[f["worker"].(int)] = f["pid"].(int)
	case "worker_exited":
		k.exited[f["pid"].(int)] = f["status"].(string)
		select {
		case k.exits <- f["pid"].(int):
		default:
		}
	case "step":
		k.lastStep = f["step"].(int64)
		select {
		case k.steps <- f["world"].(int):
		default:
		}
	case "generation":
		var pids []int
		if ms, ok := f["members"].([]map[string]any); ok {
			for _, m := range ms {
				pids = append(pids, int(m["pid"].(int64)))
			}
		}
		k.worlds <- generation{world: f["world"].(int), pids: pids}
	}
	return nil
}

// TestThirdKind registers a kind the runtime does not know (internal/
// kindtest: workers that run barriers on an elastic ring) with
// Registry.AddKind alone, and runs it through the shared launcher, the role
// dispatch of Main and the events: it trains to its end; SIGKILLed, one of
// its workers by PID, the ring closes without it and steps on; cancelled,
// it leaves nothing behind.
func TestThirdKind(t *testing.T) {
	t.Run("to its end", func(t *testing.T) {
		lc := phalanx.DefaultLaunchConfig()
		lc.Registry, lc.Model, lc.Workers, lc.Steps = registry(), "barriers", 3, 200
		k := &kindEvents{steps: make(chan int, 1), worlds: make(chan generation, 16), pidOf: map[int]int{}, exited: map[int]string{}, exits: make(chan int, 16)}
		lc.Events = k
		res, err := phalanx.Launch(launchContext(t), lc)
		if err != nil || res == nil || res.Step != 200 || res.World != 3 {
			t.Fatalf("Launch: %+v, %v; want 200 steps on 3 workers", res, err)
		}
		if k.lastStep != 200 {
			t.Fatalf("the last step event is of step %d, want 200", k.lastStep)
		}
	})
	t.Run("SIGKILL of a worker, then cancelled", func(t *testing.T) {
		lc := phalanx.DefaultLaunchConfig()
		lc.Registry, lc.Model, lc.Workers, lc.Steps = registry(), "barriers", 3, 1<<40
		k := &kindEvents{steps: make(chan int, 1), worlds: make(chan generation, 16), pidOf: map[int]int{}, exited: map[int]string{}, exits: make(chan int, 16)}
		lc.Events = k
		ctx, cancel := context.WithCancel(launchContext(t))
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := phalanx.Launch(ctx, lc)
			done <- err
		}()
		if g := testwait.Recv(t, k.worlds, 2*time.Minute, "the first generation"); g.world != 3 {
			t.Fatalf("the first generation has %d workers, want 3", g.world)
		}
		testwait.Recv(t, k.steps, 2*time.Minute, "a step of the first ring")
		k.mu2.Lock()
		pid := k.pidOf[1]
		k.mu2.Unlock()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The ring may be decided again before the kill tells (a ring that
		// took long to build on a loaded machine); the one that counts is the
		// first without the killed worker, and it holds the other two.
		g := testwait.Recv(t, k.worlds, 2*time.Minute, "a generation without the killed worker")
		for slices.Contains(g.pids, pid) {
			g = testwait.Recv(t, k.worlds, 2*time.Minute, "a generation without the killed worker")
		}
		if g.world != 2 || len(g.pids) != 2 {
			t.Fatalf("the first generation without the killed worker has %d workers (pids %v), want the other 2", g.world, g.pids)
		}

		for testwait.Recv(t, k.steps, 2*time.Minute, "a step of the ring of 2") != 2 { // steps of the ring of 3 may come first
		}
		// The ring of 2 may step before the launcher has reaped the killed
		// process (its exit can take milliseconds after its sockets
		// closed), and a cancelled launcher reports no exit after the
		// cancel: its exit first.
		for testwait.Recv(t, k.exits, 2*time.Minute, "the killed worker's exit") != pid {
		}
		cancel()
		if err := testwait.Recv(t, done, 2*time.Minute, "the cancelled launch to return"); !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled launch: %v, want context.Canceled", err)
		}
		k.mu2.Lock()
		status := k.exited[pid]
		k.mu2.Unlock()
		if status != "signal: killed" {
			t.Fatalf("the killed worker's exit: %q, want signal: killed", status)
		}
		if left := k.leftovers(t); len(left) > 0 {
			t.Fatalf("the cancelled job left %v behind", left)
		}
	})
}
