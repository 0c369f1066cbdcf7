package collective

import "testing"

// TestShmSegmentOf: the names the transport gives its segment files are
// recognised as their job's, and nothing else is.
func TestShmSegmentOf(t *testing.T) {
	job := "chaos-kill-random-1-1"
	h := JobHash(job)
	for _, tc := range []struct {
		name string
		want bool
	}{
		{rankSegName(h, 3, 2, 0x0123456789abcdef), true},
		{pairSegName(h, 12, 0, 3, 0xfedcba9876543210), true},
		{rankSegName(JobHash("another-job"), 3, 2, 1), false},
		{segName(h, 3), false},                         // a prefix alone
		{rankSegName(h, 3, 2, 1) + "-x", false},        // something after the nonce
		{pairSegName(h, 1, 0, 1, 7)[:40] + "q", false}, // cut short
		{"phalanx-xyz", false},
	} {
		if got := ShmSegmentOf(tc.name, job); got != tc.want {
			t.Errorf("ShmSegmentOf(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
