package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// TestUnreachableEtcd: every kind of process pointed at an etcd where
// nothing listens says every few seconds what it waits for, then gives up
// past --etcd-dial-timeout with an error naming the endpoint and exits 1;
// the launcher's own wait ends at an operator's first SIGINT, with a
// message.
func TestUnreachableEtcd(t *testing.T) {
	t.Parallel()
	const nothing = "http://127.0.0.1:1" // port 1: nothing listens, connections are refused
	// A line is due every 5s: at least one comes before 12s.
	common := []string{"--etcd-endpoints", nothing, "--etcd-dial-timeout", "12s", "--job", "unreachable"}
	tests := []struct {
		name string
		args []string
	}{
		{"launcher", append([]string{"train", "--workers", "1", "--steps", "5"}, common...)},
		{"worker", append([]string{"worker", "--steps", "5"}, common...)},
		{"coordinator", append([]string{"coordinator"}, common...)},
		{"parameter server", append([]string{"ps"}, common...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, out, wait := startProcess(t, tc.name, tc.args...)
			err := wait()
			if code := launch.ExitStatus(err); code != 1 {
				t.Fatalf("%s ended %v, want exit status 1\n%s", tc.name, err, out.String())
			}
			got := out.String()
			for _, want := range []string{"waiting for etcd at 127.0.0.1:1 (", "etcd at 127.0.0.1:1 did not answer within 12s"} {
				if !strings.Contains(got, want) {
					t.Errorf("%s did not say %q:\n%s", tc.name, want, got)
				}
			}
		})
	}
	t.Run("launcher, interrupted", func(t *testing.T) {
		t.Parallel()
		cmd, out, wait := startProcess(t, "launcher", "train", "--workers", "1", "--steps", "5", "--etcd-endpoints", nothing,
			"--etcd-dial-timeout", "1h", "--job", "unreachable")
		waitFor(t, out, "waiting for etcd at 127.0.0.1:1 (")
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		err := wait()
		if code := launch.ExitStatus(err); code != 1 || !strings.Contains(out.String(), "waiting for etcd at 127.0.0.1:1: signal interrupt") {
			t.Fatalf("after SIGINT the launcher ended %v, want exit status 1 and the wait's end named:\n%s", err, out.String())
		}
	})
}

// waitFor waits until out holds s, within the test deadline.
func waitFor(t *testing.T, out interface{ String() string }, s string) {
	t.Helper()
	testwait.Until(t, time.Minute, fmt.Sprintf("%q in the output", s), func() bool { return strings.Contains(out.String(), s) })
}
