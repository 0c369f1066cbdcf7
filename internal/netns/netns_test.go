package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The lab tests run children inside the namespaces: this test binary
// re-executed with PHALANX_NETNS_CHILD set to a role.
//
//	echo <addr>  listens on addr; prints "listening <addr> <pid>", then echoes
//	             every line of every connection
//	dial         reads "dial <addr> <timeout>" lines; for each, connects, sends
//	             "ping", and prints "ok <reply>" or "err <message>"
func TestMain(m *testing.M) {
	switch os.Getenv("PHALANX_NETNS_CHILD") {
	case "":
		os.Exit(m.Run())
	case "echo":
		os.Exit(echoMain(os.Args[len(os.Args)-1]))
	case "dial":
		os.Exit(dialMain())
	default:
		fmt.Fprintln(os.Stderr, "unknown child role")
		os.Exit(2)
	}
}

func echoMain(addr string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Println("err", err)
		return 1
	}
	fmt.Printf("listening %s %d\n", ln.Addr(), os.Getpid())
	for {
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

func dialMain() int {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 3 || f[0] != "dial" {
			fmt.Println("err bad command")
			continue
		}
		timeout, _ := time.ParseDuration(f[2])
		fmt.Println(ping(f[1], timeout))
	}
	return 0
}

func ping(addr string, timeout time.Duration) string {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "err " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return "err " + err.Error()
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "err " + err.Error()
	}
	return "ok " + strings.TrimSpace(reply)
}

// childWait bounds each wait for a child's line or exit: far above what a
// loaded machine needs, far below go test's timeout.
const childWait = time.Minute

// child is a started child process with line-oriented stdin and stdout.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	pipe *os.File // stdout's read end, read with a deadline
	out  *bufio.Scanner
}

func startChild(t *testing.T, ctx context.Context, h *Host, role string, args ...string) *child {
	t.Helper()
	cmd := h.Command(ctx, os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), "PHALANX_NETNS_CHILD="+role)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w := pipe(t)
	cmd.Stdout = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	c := &child{cmd: cmd, in: in, pipe: r, out: bufio.NewScanner(r)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// pipe is an os.Pipe whose read end the test closes when it ends.
func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, w
}

// line is the child's next line, read within childWait.
func (c *child) line(t *testing.T) string {
	t.Helper()
	if err := c.pipe.SetReadDeadline(time.Now().Add(childWait)); err != nil {
		t.Fatal(err)
	}
	if !c.out.Scan() {
		if errors.Is(c.out.Err(), os.ErrDeadlineExceeded) {
			t.Fatalf("child %d: waited %v for a line", c.cmd.Process.Pid, childWait)
		}
		t.Fatalf("child %d: no line: %v", c.cmd.Process.Pid, c.out.Err())
	}
	return c.out.Text()
}

// waitExit waits for cmd, started by the test, to exit, and returns its
// error; if it has not within childWait, it kills it and fails the test
// naming what it waited for.
func waitExit(t *testing.T, cmd *exec.Cmd, what string) error {
	t.Helper()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-time.After(childWait):
		_ = cmd.Process.Kill()
		t.Fatalf("waited %v for %s (pid %d) to exit; killed it", childWait, what, cmd.Process.Pid)
		return nil
	}
}

func (c *child) dial(t *testing.T, addr string, timeout time.Duration) string {
	t.Helper()
	if _, err := fmt.Fprintf(c.in, "dial %s %s\n", addr, timeout); err != nil {
		t.Fatal(err)
	}
	return c.line(t)
}

func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// rootLinks is the set of interface names in the root namespace.
func rootLinks(t *testing.T) []string {
	t.Helper()
	var names []string
	for line := range strings.Lines(ipOut(t, "-o", "link")) {
		if f := strings.Fields(line); len(f) > 1 {
			names = append(names, strings.TrimSuffix(f[1], ":"))
		}
	}
	slices.Sort(names)
	return names
}

func TestLab(t *testing.T) {
	Require(t)
	before := rootLinks(t)
	l := Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if got := rootLinks(t); !slices.Equal(got, before) {
		t.Errorf("root namespace links changed: before %v, with the lab %v", before, got)
	}
	for i := range l.Len() {
		h := l.Host(i)
		if !l.Subnet().Contains(h.Addr()) {
			t.Errorf("host %d: %v outside %v", i, h.Addr(), l.Subnet())
		}
		if r := ipOut(t, "-n", h.Name(), "route", "show", "default"); strings.TrimSpace(r) != "" {
			t.Errorf("host %d has a default route: %s", i, r)
		}
		if r := ipOut(t, "-n", h.Name(), "-6", "route", "show", "default"); strings.TrimSpace(r) != "" {
			t.Errorf("host %d has an IPv6 default route: %s", i, r)
		}
		if !strings.Contains(ipOut(t, "-n", h.Name(), "-o", "link", "show", "lo"), "UP") {
			t.Errorf("host %d: loopback not up", i)
		}
	}

	echo := startChild(t, ctx, l.Host(2), "echo", netip.AddrPortFrom(l.Host(2).Addr(), 0).String())
	f := strings.Fields(echo.line(t))
	if len(f) != 3 || f[0] != "listening" {
		t.Fatalf("echo child: %q", f)
	}
	addr := f[1]
	if pid, _ := strconv.Atoi(f[2]); pid != echo.cmd.Process.Pid {
		t.Errorf("the program's pid %d is not cmd.Process.Pid %d", pid, echo.cmd.Process.Pid)
	}
	dialer := startChild(t, ctx, l.Host(0), "dial")

	if got := dialer.dial(t, addr, 10*time.Second); got != "ok ping" {
		t.Fatalf("host 0 -> host 2 before the partition: %q", got)
	}
	if err := l.LinkDown(ctx, 2); err != nil {
		t.Fatal(err)
	}
	got := dialer.dial(t, addr, time.Second)
	if !strings.HasPrefix(got, "err ") {
		t.Fatalf("host 0 -> host 2 across the partition: %q, want an error", got)
	}
	t.Logf("across the partition: %s", got)
	if err := l.LinkUp(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := dialer.dial(t, addr, 10*time.Second); got != "ok ping" {
		t.Fatalf("host 0 -> host 2 after LinkUp: %q", got)
	}

	// The child is a real process: a signal to its pid ends it.
	if err := syscall.Kill(echo.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := echo.cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("echo child after SIGKILL: %v", err)
	}
}

// TestHostSockets: this process listens inside host 1 (Listen) and dials
// from inside host 0 (DialContext): the connection crosses the lab, from
// host 0's address. From its own namespace, which has no route to the lab,
// the same address is unreachable.
func TestHostSockets(t *testing.T) {
	l := Start(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := l.Host(1).Listen("tcp", netip.AddrPortFrom(l.Host(1).Addr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	addr := ln.Addr().String()
	c, err := l.Host(0).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("host 0 -> host 1's %s: %v", addr, err)
	}
	defer c.Close()
	select {
	case a := <-accepted:
		defer a.Close()
		if from := a.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap(); from != l.Host(0).Addr() {
			t.Errorf("host 1 accepted a connection from %s, want host 0's %s", from, l.Host(0).Addr())
		}
	case <-ctx.Done():
		t.Fatalf("host 1's listener accepted nothing from host 0's connection to %s", addr)
	}
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("this process reached %s from its own namespace", addr)
	}
}

func TestShape(t *testing.T) {
	l := Start(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	qdisc := func(ns, dev string) string { return ipOutTC(t, ns, dev) }

	if err := l.Shape(ctx, 1, Shape{Rate: 10 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, e := range [][2]string{{l.Host(1).Name(), hostLink}, {l.sw, l.Host(1).port()}} {
		if q := qdisc(e[0], e[1]); !strings.Contains(q, "tbf") {
			t.Errorf("%s %s: %q, want tbf", e[0], e[1], q)
		}
	}
	echo := startChild(t, ctx, l.Host(1), "echo", netip.AddrPortFrom(l.Host(1).Addr(), 0).String())
	addr := strings.Fields(echo.line(t))[1]
	dialer := startChild(t, ctx, l.Host(0), "dial")
	if got := dialer.dial(t, addr, 10*time.Second); got != "ok ping" {
		t.Fatalf("through a rate-capped link: %q", got)
	}

	err := l.Shape(ctx, 1, Shape{Delay: time.Millisecond, Loss: 1})
	switch {
	case errors.Is(err, ErrNoNetem):
		t.Logf("no netem in this kernel: delay and loss unavailable (%v)", err)
	case err != nil:
		t.Fatal(err)
	default:
		if q := qdisc(l.Host(1).Name(), hostLink); !strings.Contains(q, "netem") {
			t.Errorf("host side: %q, want netem", q)
		}
	}

	if err := l.Shape(ctx, 1, Shape{}); err != nil {
		t.Fatal(err)
	}
	if err := l.Shape(ctx, 1, Shape{}); err != nil {
		t.Fatalf("clearing a clean link: %v", err)
	}
	if q := qdisc(l.Host(1).Name(), hostLink); strings.Contains(q, "tbf") || strings.Contains(q, "netem") {
		t.Errorf("after clearing: %q", q)
	}
}

func ipOutTC(t *testing.T, ns, dev string) string {
	t.Helper()
	out, err := exec.Command("tc", "-n", ns, "qdisc", "show", "dev", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("tc qdisc show: %v: %s", err, out)
	}
	return string(out)
}

func TestCloseRemovesEverything(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := New(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{l.sw, l.Host(0).Name(), l.Host(1).Name()}
	list := ipOut(t, "netns", "list")
	for _, n := range names {
		if !strings.Contains(list, n) {
			t.Fatalf("%s missing from ip netns list: %s", n, list)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if list := ipOut(t, "netns", "list"); strings.Contains(list, l.id) {
		t.Errorf("after Close, ip netns list still has the lab %s: %s", l.id, list)
	}
}

func TestSweep(t *testing.T) {
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A pid that is certainly dead: a child that has exited and been reaped.
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("%s%d-sweeptest-h0", prefix, done.Process.Pid)
	mine := fmt.Sprintf("%s%d-sweeptest-h0", prefix, os.Getpid())
	for _, n := range []string{dead, mine} {
		ipOut(t, "netns", "add", n)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	}
	// An orphan of the dead run, still inside its namespace: Sweep kills it.
	orphan := exec.Command("ip", "netns", "exec", dead, "sh", "-c", "echo inside; exec sleep 1000")
	out, w := pipe(t)
	orphan.Stdout = w
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { _ = orphan.Process.Kill() })
	if err := out.SetReadDeadline(time.Now().Add(childWait)); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "inside\n" {
		t.Fatalf("orphan: %q, %v (waited up to %v for it to start)", line, err, childWait)
	}
	deleted, err := Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(deleted, dead) {
		t.Errorf("Sweep deleted %v, want %s among them", deleted, dead)
	}
	if slices.Contains(deleted, mine) {
		t.Errorf("Sweep deleted %s, whose process is alive", mine)
	}
	list := ipOut(t, "netns", "list")
	if strings.Contains(list, dead) || !strings.Contains(list, mine) {
		t.Errorf("after Sweep: %s", list)
	}
	err = waitExit(t, orphan, "the orphan Sweep should have killed")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the orphan in the stale namespace: %v, want killed by SIGKILL", err)
	}
}

// BenchmarkLab measures building and closing a three-host lab.
func BenchmarkLab(b *testing.B) {
	Require(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for b.Loop() {
		l, err := New(ctx, 3)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestDecide(t *testing.T) {
	errIP := errors.New("exec: \"ip\": executable file not found in $PATH")
	tests := []struct {
		name    string
		euid    int
		ipErr   error
		ci      string
		want    verdict
		wantErr error
	}{
		{"root", 0, nil, "", run, nil},
		{"root under CI", 0, nil, "true", run, nil},
		{"not root", 1000, nil, "", skip, ErrNotRoot},
		{"not root under CI", 1000, nil, "true", fail, ErrNotRoot},
		{"not root, CI=false", 1000, nil, "false", skip, ErrNotRoot},
		{"root without ip", 0, errIP, "", skip, ErrNoIP},
		{"root without ip under CI", 0, errIP, "true", fail, ErrNoIP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decide(tt.euid, tt.ipErr, tt.ci)
			if got != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("decide = %v, %v; want %v, %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestPickSubnet(t *testing.T) {
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	tests := []struct {
		name string
		pid  int
		used []netip.Prefix
		want netip.Prefix
	}{
		{"from the pid", 4097, nil, p("10.250.1.0/24")},
		{"unrelated addresses", 7, []netip.Prefix{p("192.0.2.0/24"), p("127.0.0.0/8")}, p("10.250.7.0/24")},
		{"the pid's /24 taken", 7, []netip.Prefix{p("10.250.7.0/24")}, p("10.250.8.0/24")},
		{"a wider prefix covering it", 255, []netip.Prefix{p("10.250.255.0/24"), p("10.250.0.0/23")}, p("10.250.2.0/24")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pickSubnet(tt.pid, tt.used); got != tt.want {
				t.Errorf("pickSubnet = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestOwnerPid(t *testing.T) {
	tests := []struct {
		name string
		pid  int
		ok   bool
	}{
		{"phx-123-abcdef-h0", 123, true},
		{"phx-123-abcdef-sw", 123, true},
		{"phx-x-abcdef-sw", 0, false},
		{"other-123-abc", 0, false},
		{"phx-123", 0, false},
	}
	for _, tt := range tests {
		if pid, ok := ownerPid(tt.name); pid != tt.pid || ok != tt.ok {
			t.Errorf("ownerPid(%q) = %d, %v; want %d, %v", tt.name, pid, ok, tt.pid, tt.ok)
		}
	}
}
