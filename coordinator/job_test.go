package coordinator

import (
	"context"
	"testing"
	"time"
)

// TestClaimFinalCheckpoint: the first claim wins; the winner's claim sent
// again (a retry whose first answer was lost) still wins; any other loses.
func TestClaimFinalCheckpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "finalckpt")
	for i, tc := range []struct {
		owner string
		won   bool
	}{
		{"w1 (pid 11)", true},
		{"w1 (pid 11)", true},
		{"w2 (pid 12)", false},
		{"w1 (pid 13)", false}, // the same worker id in another process
		{"w1 (pid 11)", true},
	} {
		won, err := NewJob(cli, keys).ClaimFinalCheckpoint(ctx, tc.owner)
		if err != nil || won != tc.won {
			t.Fatalf("claim %d by %s: %v, %v; want %v", i, tc.owner, won, err, tc.won)
		}
	}
}
