package collective

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// settledGoroutines waits, by yielding rather than sleeping, for goroutines to
// drop to want, and returns the count.
func settledGoroutines(want int) int {
	n := runtime.NumGoroutine()
	for i := 0; i < 10000 && n > want; i++ {
		runtime.Gosched()
		n = runtime.NumGoroutine()
	}
	return n
}

// TestRebuildNextGeneration: a group broken by an abort is replaced by
// generation+1 and works; nothing of the old one keeps running.
func TestRebuildNextGeneration(t *testing.T) {
	base := runtime.NumGoroutine()
	net := NewInprocNetwork()
	peers := []string{"a", "b", "c"}
	join := func(gen uint64) []*Group {
		gs := make([]*Group, 3)
		mustAll(t, onEveryRank(gs, func(r int, _ *Group) error {
			g, err := Join(context.Background(), net, Membership{Job: "j", Generation: gen, Rank: r, Peers: peers}, Options{})
			gs[r] = g
			return err
		}))
		return gs
	}
	g1 := join(1)
	g1[1].Abort("test")
	for r, g := range g1 {
		err := g.Barrier(context.Background())
		if !errors.Is(err, ErrAborted) {
			t.Errorf("generation 1 rank %d: %v, want ErrAborted", r, err)
		}
	}
	closeGroups(g1)
	g2 := join(2)
	mustAll(t, onEveryRank(g2, func(r int, g *Group) error {
		x := []float64{float64(r)}
		if err := g.AllReduce(context.Background(), Float64s(x), Sum); err != nil {
			return err
		}
		if x[0] != 3 {
			t.Errorf("rank %d: %v", r, x[0])
		}
		return nil
	}))
	closeGroups(g2)
	if n := settledGoroutines(base); n > base {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines left behind:\n%s", n-base, buf[:runtime.Stack(buf, true)])
	}
}

// TestContextCancel: cancelling a waiting rank fails it with ErrAborted
// wrapping context.Canceled; its peers learn of it at their next operation.
func TestContextCancel(t *testing.T) {
	groups := inprocGroups(t, 3, 1, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- groups[0].Barrier(ctx) }()
	cancel()
	err := <-done
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want ErrAborted wrapping context.Canceled", err)
	}
	errs := onEveryRank(groups[1:], func(r int, g *Group) error { return g.Barrier(context.Background()) })
	for r, err := range errs {
		if !errors.Is(err, ErrAborted) {
			t.Errorf("rank %d: %v, want the relayed ErrAborted", r+1, err)
		}
	}
}

// TestDeadlineNamesMissingRank: a rank that never calls makes the others'
// operation fail with ErrTimeout at the context's deadline.
func TestDeadlineNamesMissingRank(t *testing.T) {
	groups := inprocGroups(t, 2, 1, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := groups[0].AllReduce(ctx, Float32s(make([]float32, 8)), Sum)
	var oe *OpError
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &oe) || oe.Rank != 1 {
		t.Fatalf("got %v, want ErrTimeout naming rank 1", err)
	}
}

// TestClosedGroup: operations on a closed group fail with ErrClosed.
func TestClosedGroup(t *testing.T) {
	groups := inprocGroups(t, 2, 1, Options{})
	closeGroups(groups)
	if err := groups[0].Barrier(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
}
