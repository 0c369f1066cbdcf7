package launch

import (
	"runtime"
	"testing"
)

func TestThreadsPerRank(t *testing.T) {
	cores := runtime.NumCPU()
	for _, tc := range []struct{ want, ranks, got int }{
		{want: 3, ranks: 8, got: 3},
		{want: 0, ranks: 1, got: cores},
		{want: 0, ranks: cores * 4, got: 1},
		{want: 0, ranks: 0, got: cores},
	} {
		if got := ThreadsPerRank(tc.want, tc.ranks); got != tc.got {
			t.Errorf("ThreadsPerRank(%d, %d) = %d, want %d", tc.want, tc.ranks, got, tc.got)
		}
	}
}
