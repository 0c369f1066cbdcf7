package collective

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// inprocGroups builds a connected group of n ranks over an in-process network.
func inprocGroups(t testing.TB, n int, gen uint64, opts Options) []*Group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	groups, err := InprocGroups(ctx, n, "test", gen, opts)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	t.Cleanup(func() { closeGroups(groups) })
	return groups
}

func closeGroups(groups []*Group) { CloseGroups(groups) }

// onEveryRank runs f concurrently for every rank and returns the errors.
func onEveryRank(groups []*Group, f func(r int, g *Group) error) []error {
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, g)
		}()
	}
	wg.Wait()
	return errs
}

func mustAll(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// testContext ends with the test, and after two minutes at the latest, so
// that a blocking call of a test fails rather than hanging the package.
func testContext(t testing.TB) context.Context { return testwait.Context(t, 2*time.Minute) }
