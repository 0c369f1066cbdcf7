package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	prefix     = "phx-"
	bridge     = "br0"
	hostLink   = "eth0"
	closeLimit = 30 * time.Second
)

// Lab is a set of host namespaces joined by a bridge in a switch namespace.
type Lab struct {
	ip     string // path of the ip command
	id     string // phx-<pid>-<random>
	sw     string // the switch namespace
	subnet netip.Prefix
	hosts  []*Host

	closeOnce sync.Once
	closeErr  error
}

// Host is one namespace of a lab.
type Host struct {
	lab   *Lab
	index int
	name  string
	addr  netip.Addr
}

// Start builds a lab of hosts for the test and closes it when the test ends;
// it skips (or, under CI=true, fails) the test when labs cannot be built here.
func Start(t testing.TB, hosts int) *Lab {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := New(ctx, hosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return l
}

// New builds a lab of hosts namespaces. The caller must Close it.
func New(ctx context.Context, hosts int) (*Lab, error) {
	if hosts < 1 || hosts > 250 {
		return nil, fmt.Errorf("netns: %d hosts: want 1 to 250", hosts)
	}
	if err := Check(); err != nil {
		return nil, err
	}
	ip, _ := exec.LookPath("ip")
	_, _ = Sweep(ctx) // best effort: a failed sweep must not stop this lab
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("netns: lab id: %w", err)
	}
	used, err := rootPrefixes()
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	l := &Lab{
		ip:     ip,
		id:     fmt.Sprintf("%s%d-%s", prefix, pid, hex.EncodeToString(rnd[:])),
		subnet: pickSubnet(pid, used),
	}
	l.sw = l.id + "-sw"
	for i := range hosts {
		a := l.subnet.Addr().As4()
		a[3] = byte(i + 1)
		l.hosts = append(l.hosts, &Host{lab: l, index: i, name: fmt.Sprintf("%s-h%d", l.id, i), addr: netip.AddrFrom4(a)})
	}
	if err := l.build(ctx); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// build creates the namespaces and links, one `ip -batch` per namespace.
// Every link is created inside the lab's namespaces, so the root namespace
// never sees one.
func (l *Lab) build(ctx context.Context) error {
	adds := []string{"netns add " + l.sw}
	sw := []string{"link set lo up", "link add " + bridge + " type bridge", "link set " + bridge + " up"}
	for _, h := range l.hosts {
		adds = append(adds, "netns add "+h.name)
		sw = append(sw,
			fmt.Sprintf("link add %s type veth peer name %s netns %s", h.port(), hostLink, h.name),
			fmt.Sprintf("link set %s master %s up", h.port(), bridge))
	}
	if err := l.batch(ctx, "", false, adds); err != nil {
		return err
	}
	if err := l.batch(ctx, l.sw, false, sw); err != nil {
		return err
	}
	for _, h := range l.hosts {
		err := l.batch(ctx, h.name, false, []string{
			"link set lo up",
			fmt.Sprintf("addr add %s dev %s", netip.PrefixFrom(h.addr, l.subnet.Bits()), hostLink),
			"link set " + hostLink + " up",
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// batch runs ip commands, one per line, in namespace ns ("" for this
// process's own). ip stops at the first that fails, unless force is set.
func (l *Lab) batch(ctx context.Context, ns string, force bool, lines []string) error {
	var args []string
	if ns != "" {
		args = []string{"-n", ns}
	}
	if force {
		args = append(args, "-force")
	}
	args = append(args, "-batch", "-")
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, l.ip, args...)
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("netns: ip %s (%s): %w: %s", strings.Join(args, " "), strings.Join(lines, "; "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// run runs ip with args and wraps its output into the error.
func (l *Lab) run(ctx context.Context, args ...string) error {
	if err := runCmd(ctx, l.ip, args...); err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	return nil
}

func runCmd(ctx context.Context, bin string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Len is the number of hosts.
func (l *Lab) Len() int { return len(l.hosts) }

// Host is host i, 0 <= i < Len().
func (l *Lab) Host(i int) *Host { return l.hosts[i] }

// Subnet is the lab's private /24.
func (l *Lab) Subnet() netip.Prefix { return l.subnet }

// Close deletes every link and namespace of the lab. It is safe to call more
// than once; later calls return the first call's error.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeLimit)
		defer cancel()
		present, err := namespaces(ctx, l.ip)
		if err != nil {
			l.closeErr = err
			return
		}
		var errs []error
		if present[l.sw] {
			// Deleting the switch side deletes each pair even when a lingering
			// process keeps its host namespace alive. -force: a pair already
			// gone must not stop the others.
			var dels []string
			for _, h := range l.hosts {
				dels = append(dels, "link del "+h.port())
			}
			if err := l.batch(ctx, l.sw, true, dels); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
				errs = append(errs, err)
			}
		}
		var dels []string
		for _, h := range l.hosts {
			if present[h.name] {
				dels = append(dels, "netns del "+h.name)
			}
		}
		if present[l.sw] {
			dels = append(dels, "netns del "+l.sw)
		}
		if len(dels) > 0 {
			errs = append(errs, l.batch(ctx, "", true, dels))
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// Index is the host's position in the lab.
func (h *Host) Index() int { return h.index }

// Name is the host's namespace name.
func (h *Host) Name() string { return h.name }

// Addr is the host's address on the lab's subnet.
func (h *Host) Addr() netip.Addr { return h.addr }

// port is the switch-side end of the host's veth pair.
func (h *Host) port() string { return fmt.Sprintf("p%d", h.index) }

// Command returns an unstarted command running name with args inside the
// host's namespace. ip netns exec enters the namespace and execs name in the
// same process, so cmd.Process.Pid is the program's pid.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, h.lab.ip, append([]string{"netns", "exec", h.name, name}, args...)...)
}

// pickSubnet chooses 10.250.x.0/24 with x derived from pid, skipping any x
// whose /24 overlaps a prefix the root namespace uses. The lab's namespaces
// have no route out, so this only keeps addresses unambiguous to a reader.
func pickSubnet(pid int, used []netip.Prefix) netip.Prefix {
	start := pid % 256
	for k := range 256 {
		x := byte((start + k) % 256)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 250, x, 0}), 24)
		if !overlapsAny(p, used) {
			return p
		}
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 250, byte(start), 0}), 24)
}

func overlapsAny(p netip.Prefix, used []netip.Prefix) bool {
	for _, u := range used {
		if p.Overlaps(u) {
			return true
		}
	}
	return false
}

// rootPrefixes lists the IPv4 prefixes on this process's (root) namespace.
func rootPrefixes() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("netns: listing addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || !ip.Unmap().Is4() {
			continue
		}
		bits, _ := n.Mask.Size()
		if bits > 32 {
			bits -= 96
		}
		out = append(out, netip.PrefixFrom(ip.Unmap(), bits).Masked())
	}
	return out, nil
}
