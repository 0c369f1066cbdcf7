package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/netns"
)

// TestNetnsServiceChoice: a netns service only for job.network netns, and
// not beside an etcd cluster or a ps job.
func TestNetnsServiceChoice(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  JobSpec
		want string // "" none, "svc" a service, else the error
	}{
		{"loopback", JobSpec{Workers: 3, Steps: 10}, ""},
		{"netns", JobSpec{Workers: 3, Steps: 10, Network: "netns"}, "svc"},
		{"netns and cluster", JobSpec{Workers: 3, Steps: 10, Network: "netns", Etcd: "cluster"}, "not with job.etcd cluster"},
		{"netns and ps", JobSpec{Workers: 3, Steps: 10, Network: "netns", Kind: "ps"}, "ring workers only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := netnsService(&Scenario{Name: tc.name, Job: tc.job})
			switch {
			case tc.want == "" && (s != nil || err != nil):
				t.Fatalf("%v, %v: want no service", s, err)
			case tc.want == "svc" && (s == nil || err != nil || s.Name() != "netns"):
				t.Fatalf("%v, %v: want the netns service", s, err)
			case tc.want != "" && tc.want != "svc" && (err == nil || !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("%v: want an ErrScenario saying %q", err, tc.want)
			}
		})
	}
}

// TestNetnsNeedsRoot: without root, Start says the scenario needs it. As
// root, the test runs itself again as user nobody (a copy of this test
// binary nobody may run), so the check always runs.
func TestNetnsNeedsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		s, _ := netnsService(&Scenario{Name: "x", Job: JobSpec{Workers: 2, Steps: 10, Network: "netns"}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := s.Start(ctx, t.TempDir(), zap.NewNop())
		if !errors.Is(err, ErrNeedsRoot) || !strings.Contains(err.Error(), "needs root") {
			t.Fatalf("Start without root: %v, want ErrNeedsRoot", err)
		}
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "netns-needs-root-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "chaos.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^TestNetnsNeedsRoot$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	home := filepath.Join(dir, "home") // nobody's to write in
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "HOME="+home, "TMPDIR="+home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestNetnsNeedsRoot") {
		t.Fatalf("the test run as user nobody: %v\n%s", err, out)
	}
}

// TestNetnsLab: the service's lab carries real traffic between namespaces:
// a worker's data plane (here an echo server on host 0's loopback) is
// reached from host 1 through host 0's proxy at host 0's address; the
// etcd serves every host and the root namespace; Command places the n-th
// worker of a launch on host n with its bind and advertised addresses;
// a partition cuts host 0 off and its end lets the traffic through again;
// Close leaves nothing behind.
func TestNetnsLab(t *testing.T) {
	netns.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	svc, err := netnsService(&Scenario{Name: "lab", Job: JobSpec{Workers: 2, Steps: 10, Network: "netns"}})
	if err != nil {
		t.Fatal(err)
	}
	s := svc.(*netnsLab)
	s.log = zap.NewNop()
	if err := s.start(ctx, t.TempDir()); err != nil { // the lab alone: no worker runs here
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	h0, h1 := s.lab.Host(0), s.lab.Host(1)

	// The worker's data plane on host 0's loopback: an echo server.
	ln, err := h0.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", netnsData))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	front := netip.AddrPortFrom(h0.Addr(), netnsFront).String()
	echo := func(ctx context.Context, msg string) error {
		c, err := h1.DialContext(ctx, "tcp", front)
		if err != nil {
			return err
		}
		defer c.Close()
		if d, ok := ctx.Deadline(); ok {
			c.SetDeadline(d)
		}
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != msg {
			return fmt.Errorf("echoed %q, want %q", got, msg)
		}
		return nil
	}
	if err := echo(ctx, "across the lab"); err != nil {
		t.Fatalf("host 1 to host 0's data plane through its proxy: %v", err)
	}
	// Counted once written, which may be just after the client read them.
	if err := s.proxies[0].Wait(ctx, func(st ProxyStats) bool {
		return st.Conns == 1 && st.Forwarded == 2*int64(len("across the lab"))
	}); err != nil {
		t.Fatalf("host 0's proxy: %+v, want the one connection's bytes: %v", s.proxies[0].Stats(), err)
	}

	// etcd: from the root namespace and from host 1.
	ep := strings.TrimPrefix(s.etcd.Endpoints()[0], "http://")
	for _, from := range []*netns.Host{nil, h1} {
		var c net.Conn
		where := "the root namespace"
		if from == nil {
			c, err = net.Dial("tcp", ep)
		} else {
			where = from.Name()
			c, err = from.DialContext(ctx, "tcp", ep)
		}
		if err != nil {
			t.Fatalf("etcd %s from %s: %v", ep, where, err)
		}
		c.Close()
	}

	// Command: the n-th call of a launch is worker n, on host n.
	lc := phalanx.DefaultLaunchConfig()
	s.Configure(&lc)
	if !slices.Equal(lc.Etcd, s.etcd.Endpoints()) {
		t.Fatalf("launch etcd %v, want the lab's %v", lc.Etcd, s.etcd.Endpoints())
	}
	for i := range 3 {
		cmd, err := lc.Command()
		if i == 2 {
			if err == nil {
				t.Fatal("a third worker on a lab of two hosts")
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		h := s.lab.Host(i)
		args := strings.Join(cmd.Args, " ")
		adv := advertiseEnv + "=" + netip.AddrPortFrom(h.Addr(), netnsFront).String()
		if !strings.Contains(args, "netns exec "+h.Name()+" ") || !slices.Contains(cmd.Env, adv) {
			t.Fatalf("worker %d: %s with %v, want it in %s advertising %s", i, args, cmd.Env, h.Name(), adv)
		}
	}

	// A partition of host 0: its proxy is unreachable until the link is up.
	if err := s.lab.LinkDown(ctx, 0); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	err = echo(short, "cut off")
	cancelShort()
	if err == nil {
		t.Fatal("host 0's data plane answered across a partition")
	}
	if err := s.lab.LinkUp(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := echo(ctx, "healed"); err != nil {
		t.Fatalf("after the partition: %v", err)
	}

	closed = true
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left := s.Leftovers(); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestNetnsScenarios runs the built-in network scenarios against real jobs
// in network namespaces: every invariant holds.
func TestNetnsScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("real jobs: not in -short")
	}
	netns.Require(t)
	dir := jobtest.KeptDir(t)
	r := &Runner{Registry: examples.Registry(), Dir: dir, Output: testWriter{t}}
	if testing.Verbose() {
		r.Configure = func(lc *phalanx.LaunchConfig) { lc.Output, lc.LogLevel = testWriter{t}, "info" }
	}
	for _, sc := range netnsScenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			rep := runAndCheck(t, r, sc, 1)
			for _, f := range rep.Faults {
				if f.What == "" || f.Injected.IsZero() || f.Error != "" {
					t.Errorf("fault %d (%s): %+v", f.Index, f.Kind, f)
				}
			}
			if !rep.Passed {
				t.Errorf("the run failed; kept in %s", rep.Dir)
			}
		})
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
