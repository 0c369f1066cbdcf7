package collective

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// observed keeps what an Observer was told.
type observed struct {
	mu  sync.Mutex
	ops []OpRecord
}

func (o *observed) OpEnded(r *OpRecord) {
	o.mu.Lock()
	o.ops = append(o.ops, *r)
	o.mu.Unlock()
}

// TestRecorder: every rank's hang recorder holds its last operations in
// order, with their kind, number, size, algorithm, state and the phase
// the rank marked; the Observer is told each; a ring buffer keeps only
// the last Options.Recent; and when one rank never enters an operation,
// the others' last entry is that operation, failed.
func TestRecorder(t *testing.T) {
	obs := make([]*observed, 3)
	groups := make([]*Group, 3)
	for r := range obs {
		obs[r] = &observed{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gs, err := InprocGroups(ctx, 3, "test", 5, Options{Recent: 4, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeGroups(gs) })
	for r, g := range gs {
		g.opts.Observer = obs[r]
		groups[r] = g
	}
	steps := []struct {
		op    string
		bytes int
		run   func(g *Group) error
	}{
		{"allreduce", 4 * 1000, func(g *Group) error { return g.AllReduce(ctx, Float32s(make([]float32, 1000)), Sum) }},
		{"barrier", 0, func(g *Group) error { return g.Barrier(ctx) }},
		{"allreduce", 4 * 10, func(g *Group) error { return g.AllReduce(ctx, Float32s(make([]float32, 10)), Sum) }},
		{"broadcast", 4 * 7, func(g *Group) error { return g.Broadcast(ctx, Float32s(make([]float32, 7)), 0) }},
		{"allreduce", 4 * 3, func(g *Group) error { return g.AllReduce(ctx, Float32s(make([]float32, 3)), Sum) }},
	}
	for i, s := range steps {
		mustAll(t, onEveryRank(groups, func(r int, g *Group) error {
			g.Mark("backward", int64(100+i))
			return s.run(g)
		}))
	}
	for r, g := range groups {
		got := g.Recent()
		if len(got) != 4 {
			t.Fatalf("rank %d keeps %d operations, want the last 4", r, len(got))
		}
		for k, rec := range got {
			i := k + 1 // the first was pushed out
			s := steps[i]
			want := OpRecord{Op: s.op, Group: "test", Seq: uint64(i + 1), Generation: 5, Rank: r, World: 3, Bytes: s.bytes, State: "done",
				Plane: "tcp", Phase: "backward", Step: int64(100 + i)}
			rec.Start, rec.End, rec.Algorithm = time.Time{}, time.Time{}, ""
			if rec != want {
				t.Errorf("rank %d entry %d: %+v, want %+v", r, k, rec, want)
			}
		}
		if a := got[3].Algorithm; a == "" {
			t.Errorf("rank %d: an allreduce's algorithm is not recorded", r)
		}
		if n := len(obs[r].ops); n != len(steps) {
			t.Errorf("rank %d: the observer was told %d operations, want %d", r, n, len(steps))
		}
	}
	// Rank 2 never enters the sixth operation.
	errs := onEveryRank(groups[:2], func(r int, g *Group) error {
		g.Mark("backward", 200)
		return g.AllReduce(ctx, Float32s(make([]float32, 5)), Sum)
	})
	for r, err := range errs {
		var oe *OpError
		if !errors.As(err, &oe) {
			t.Fatalf("rank %d: %v, want an OpError", r, err)
		}
		last := groups[r].Recent()[3]
		if last.Op != "allreduce" || last.Seq != 6 || last.State != "failed" || last.Err == "" || last.Step != 200 {
			t.Errorf("rank %d: the hung operation is recorded as %+v", r, last)
		}
	}
	if last := groups[2].Recent()[3]; last.Seq != 5 || last.State != "done" {
		t.Errorf("rank 2, which never entered operation 6, records %+v last", last)
	}
}
