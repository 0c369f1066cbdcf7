package collective

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// libraryGoroutines returns the stacks of goroutines running the package's own
// machinery (links, groups, transports), yielding rather than sleeping until
// there are none or it gives up.
func libraryGoroutines() []string {
	var found []string
	for i := 0; i < 10000; i++ {
		buf := make([]byte, 1<<20)
		found = found[:0]
		for _, st := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(st, "collective.(*link)") || strings.Contains(st, "collective.(*TCPTransport)") ||
				strings.Contains(st, "collective.(*Fuser") {
				found = append(found, st)
			}
		}
		if len(found) == 0 {
			return nil
		}
		runtime.Gosched()
	}
	return found
}

// TestRebuildNextGeneration: a group broken by an abort is replaced by
// generation+1 and works; nothing of the old one keeps running.
func TestRebuildNextGeneration(t *testing.T) {
	net := NewInprocNetwork()
	peers := []string{"a", "b", "c"}
	ctx := testContext(t)
	join := func(gen uint64) []*Group {
		gs := make([]*Group, 3)
		mustAll(t, onEveryRank(gs, func(r int, _ *Group) error {
			g, err := Join(ctx, net, Membership{Job: "j", Generation: gen, Rank: r, Peers: peers}, Options{})
			gs[r] = g
			return err
		}))
		return gs
	}
	g1 := join(1)
	g1[1].Abort("test")
	for r, g := range g1 {
		err := g.Barrier(ctx)
		if !errors.Is(err, ErrAborted) {
			t.Errorf("generation 1 rank %d: %v, want ErrAborted", r, err)
		}
	}
	closeGroups(g1)
	g2 := join(2)
	mustAll(t, onEveryRank(g2, func(r int, g *Group) error {
		x := []float64{float64(r)}
		if err := g.AllReduce(ctx, Float64s(x), Sum); err != nil {
			return err
		}
		if x[0] != 3 {
			t.Errorf("rank %d: %v", r, x[0])
		}
		return nil
	}))
	closeGroups(g2)
	if left := libraryGoroutines(); len(left) > 0 {
		t.Fatalf("%d goroutines left behind:\n%s", len(left), strings.Join(left, "\n\n"))
	}
}

// TestContextCancel: cancelling a rank blocked inside a Barrier (its peers
// never arrive) fails it with ErrAborted wrapping context.Canceled; its
// peers learn of it at their next operation.
func TestContextCancel(t *testing.T) {
	// A long operation timeout: only the cancellation can end rank 0's wait.
	groups := inprocGroups(t, 3, 1, Options{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- groups[0].Barrier(ctx) }()
	// In round one of the dissemination rank 0 signals rank 1 and then waits
	// for rank 2. Rank 1 runs no operation, so its link from rank 0 holds
	// that signal parked: proof that rank 0 is inside the Barrier, sent its
	// frame and is now waiting.
	waitUntil(t, 10*time.Second, "rank 0's barrier frame parked at rank 1 (rank 0 inside the Barrier)", func() bool {
		return groups[1].links[0].parked.Load()
	})
	select {
	case err := <-done:
		t.Fatalf("the Barrier returned %v before any peer arrived", err)
	default:
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0's Barrier did not return within 10s of its context's cancellation")
	}
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want ErrAborted wrapping context.Canceled", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	errs := onEveryRank(groups[1:], func(r int, g *Group) error { return g.Barrier(ctx2) })
	for r, err := range errs {
		if !errors.Is(err, ErrAborted) {
			t.Errorf("rank %d: %v, want the relayed ErrAborted", r+1, err)
		}
	}
}

// waitUntil yields until cond holds, failing the test, naming what it
// waited for, after limit.
func waitUntil(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		runtime.Gosched()
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
	if err := groups[0].Barrier(testContext(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
}
