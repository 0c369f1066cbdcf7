package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/phalanx-rt/phalanx/internal/procenv"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/internal/netns"
)

// How a job with job.network netns is laid out (netnsLab):
//
//   - a lab of network namespaces (internal/netns), one host per worker,
//     each joined by a veth pair to a bridge in the lab's switch namespace;
//   - one more veth pair joins the runner's own (root) namespace to the
//     bridge, at the lab subnet's address .254: the launcher, its
//     coordinator and the runner reach every host, and every host reaches
//     them. The job's etcd is an embedded server the service starts in
//     the runner's process on that address (the launcher's own embedded
//     etcd listens on 127.0.0.1 of the root namespace, which no host can
//     reach), so a partition cuts a worker off from etcd too;
//   - worker i runs in host i's namespace (`ip netns exec`, through
//     LaunchConfig.Command), its data plane bound to 127.0.0.1:netnsData of
//     its own namespace and advertised at host i's address :netnsFront,
//     where a Proxy listening inside host i's namespace relays to it. Every
//     connection into worker i's data plane crosses the veth links and
//     then that proxy: slow and lossy links are faults set on it. (The
//     worker's control plane binds host i's address directly.)
const (
	netnsData  = 7070 // a worker's data plane, on its namespace's loopback
	netnsFront = 7071 // its proxy, on its namespace's lab address
	netnsGWEnd = 254  // the root namespace's address on the lab subnet
)

// netnsDir is where `ip netns add` keeps its namespaces' handles.
const netnsDir = "/run/netns"

// The variables a launched worker reads for its data plane's bind and
// advertised addresses.
const (
	bindEnv      = procenv.Bind
	advertiseEnv = procenv.Advertise
)

// ErrNeedsRoot is wrapped by the error of a run whose job needs network
// namespaces where they cannot be made (not root, or no iproute2).
var ErrNeedsRoot = errors.New("chaos: job.network netns needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2's ip")

// netnsService puts each worker of a scenario with job.network "netns" in
// a network namespace of its own (nil: none).
func netnsService(sc *Scenario) (Service, error) {
	if sc.Job.Network != "netns" {
		return nil, nil
	}
	if sc.Job.Etcd == "cluster" {
		return nil, fmt.Errorf("%w %q: job.network netns runs its own etcd inside the lab: not with job.etcd cluster", ErrScenario, sc.Name)
	}
	if sc.Job.Kind == "ps" {
		return nil, fmt.Errorf("%w %q: job.network netns places ring workers only, not a ps job's processes", ErrScenario, sc.Name)
	}
	hosts := sc.Job.Workers
	for _, f := range sc.Faults {
		hosts = max(hosts, f.World)
	}
	return &netnsLab{hosts: hosts}, nil
}

// netnsLab is the network-namespace service of a run.
type netnsLab struct {
	hosts int
	log   *zap.Logger

	lab      *netns.Lab
	gw       string // the root namespace's end of the gateway veth
	gwAddr   netip.Addr
	etcd     *coordinator.Embedded
	proxies  []*Proxy // by host: in front of its worker's data plane
	labName  string   // the lab's namespace prefix, for Leftovers
	mu       sync.Mutex
	launches int
}

func (s *netnsLab) Name() string { return "netns" }

// Start builds the lab, its gateway, its etcd and the proxies.
func (s *netnsLab) Start(ctx context.Context, dir string, log *zap.Logger) error {
	s.log = log.Named("netns")
	if err := netns.Check(); err != nil {
		return fmt.Errorf("%w: %w", ErrNeedsRoot, err)
	}
	return s.start(ctx, dir)
}

// start builds the lab (Start, without its checks).
func (s *netnsLab) start(ctx context.Context, dir string) (err error) {
	log := s.log
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.lab, err = netns.New(ctx, s.hosts); err != nil {
		return err
	}
	h0 := s.lab.Host(0).Name()
	s.labName = strings.TrimSuffix(h0, "-h0")
	if err := s.gateway(ctx); err != nil {
		return err
	}
	if s.etcd, err = coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: filepath.Join(dir, "netns-etcd"),
		Host: s.gwAddr.String(), Logger: log.Named("etcd")}); err != nil {
		return err
	}
	for i := range s.lab.Len() {
		h := s.lab.Host(i)
		ln, err := h.Listen("tcp", netip.AddrPortFrom(h.Addr(), netnsFront).String())
		if err != nil {
			return err
		}
		s.proxies = append(s.proxies, NewProxy(ln, dialerIn(h, fmt.Sprintf("127.0.0.1:%d", netnsData)), uint64(i)+1))
	}
	s.log.Info("lab ready", zap.String("lab", s.labName), zap.Stringer("subnet", s.lab.Subnet()),
		zap.Strings("etcd", s.etcd.Endpoints()))
	return nil
}

// gateway joins the root namespace to the lab's bridge at .254.
func (s *netnsLab) gateway(ctx context.Context) error {
	var rnd [3]byte
	rand.Read(rnd[:])
	s.gw = "phxgw" + hex.EncodeToString(rnd[:]) // 11 characters: under IFNAMSIZ
	sw := s.labName + "-sw"
	a := s.lab.Subnet().Addr().As4()
	a[3] = netnsGWEnd
	s.gwAddr = netip.AddrFrom4(a)
	for _, args := range [][]string{
		{"link", "add", s.gw, "type", "veth", "peer", "name", "gw", "netns", sw},
		{"-n", sw, "link", "set", "gw", "master", "br0", "up"},
		{"addr", "add", netip.PrefixFrom(s.gwAddr, s.lab.Subnet().Bits()).String(), "dev", s.gw},
		{"link", "set", s.gw, "up"},
	} {
		if err := ipCmd(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

func ipCmd(ctx context.Context, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("chaos: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Configure points the launch at the lab's etcd and starts its workers in
// the lab: the launcher starts a launch's workers in index order, one
// Command call each (launch.go's spawn; the Command gets no index), so
// the n-th call of a launch is worker n, on host n.
func (s *netnsLab) Configure(lc *phalanx.LaunchConfig) {
	if s.etcd == nil {
		return
	}
	lc.Etcd = s.etcd.Endpoints()
	s.mu.Lock()
	s.launches++
	s.mu.Unlock()
	var (
		mu sync.Mutex
		n  int
	)
	lc.Command = func() (*exec.Cmd, error) {
		mu.Lock()
		i := n
		n++
		mu.Unlock()
		if i >= s.lab.Len() {
			return nil, fmt.Errorf("chaos: worker %d of a launch, and the lab has %d hosts", i, s.lab.Len())
		}
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("chaos: this program's path, to start workers in the lab: %w", err)
		}
		h := s.lab.Host(i)
		cmd := h.Command(context.Background(), exe)
		cmd.Env = []string{
			fmt.Sprintf("%s=127.0.0.1:%d", bindEnv, netnsData),
			advertiseEnv + "=" + netip.AddrPortFrom(h.Addr(), netnsFront).String(),
		}
		return cmd, nil
	}
}

// dialerIn dials addr from inside host h's namespace.
func dialerIn(h *netns.Host, addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) { return h.DialContext(ctx, "tcp", addr) }
}

// Leftovers are the lab's namespaces and the gateway link, if still there.
func (s *netnsLab) Leftovers() []string {
	var out []string
	if s.labName != "" {
		ents, _ := os.ReadDir(netnsDir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), s.labName+"-") {
				out = append(out, "network namespace "+e.Name())
			}
		}
	}
	if s.gw != "" {
		if _, err := net.InterfaceByName(s.gw); err == nil {
			out = append(out, "link "+s.gw+" in the root namespace")
		}
	}
	return out
}

// Close stops the proxies and the etcd, and deletes the gateway and the
// lab. The launch's workers are gone by then (the launcher waits for
// them).
func (s *netnsLab) Close() error {
	var errs []error
	for _, p := range s.proxies {
		p.Close()
	}
	s.proxies = nil
	if s.etcd != nil {
		s.etcd.Close()
		s.etcd = nil
	}
	if s.gw != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := ipCmd(ctx, "link", "del", s.gw); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
		}
		cancel()
	}
	if s.lab != nil {
		errs = append(errs, s.lab.Close())
	}
	return errors.Join(errs...)
}

// hostOf is the lab host of the fault's target rank, found by the address
// it advertises (its proxy's).
func (s *netnsLab) hostOf(env *Env) (int, error) {
	m, err := env.target()
	if err != nil {
		return 0, err
	}
	ap, err := netip.ParseAddrPort(m.DataAddr)
	if err != nil {
		return 0, fmt.Errorf("rank %d's data-plane address %q: %w", env.Rank, m.DataAddr, err)
	}
	for i := range s.lab.Len() {
		if s.lab.Host(i).Addr() == ap.Addr() {
			return i, nil
		}
	}
	return 0, fmt.Errorf("rank %d's data-plane address %s is on no host of the lab (%s)", env.Rank, m.DataAddr, s.lab.Subnet())
}

// labOf is the run's netns service.
func labOf(env *Env) (*netnsLab, error) {
	s, _ := env.Service("netns").(*netnsLab)
	if s == nil || s.lab == nil {
		return nil, errors.New("the job runs in no network namespaces (job.network netns)")
	}
	return s, nil
}

// netnsKinds are the network faults: partitions, slow and lossy links.
func netnsKinds() []Kind {
	return []Kind{
		{Name: "partition", Doc: "take the target worker's link down for the fault's duration, then up (it loses the other workers and etcd): shorter than the lease and the operation timeout, the ring waits for it",
			NeedsRank: true, Needs: "netns", Changes: "none",
			New: func(p Planned) Fault { return &partition{p: p} }},
		{Name: "partition-long", Doc: "take the target worker's link down for the fault's duration (longer than the lease), then up: the ring closes without it",
			NeedsRank: true, Needs: "netns", Changes: "ring",
			New: func(p Planned) Fault { return &partition{p: p} }},
		{Name: "slow-link", Doc: "delay every chunk of every connection of the target's data plane by 20ms and cap each direction at 2 MiB/s (the lab's proxies) for the fault's duration: the ring slows and trains on",
			NeedsRank: true, Needs: "netns", Changes: "none",
			New: func(p Planned) Fault {
				return &linkFault{p: p, what: "slow", f: ProxyFaults{Delay: 20 * time.Millisecond, Rate: 2 << 20}}
			}},
		{Name: "lossy-link", Doc: "hold 30% of the chunks of every connection of the target's data plane for a retransmission timeout (200ms; the lab's proxies) for the fault's duration: the ring slows and trains on",
			NeedsRank: true, Needs: "netns", Changes: "none",
			New: func(p Planned) Fault {
				return &linkFault{p: p, what: "lossy", f: ProxyFaults{Loss: 0.3, LossDelay: 200 * time.Millisecond}}
			}},
	}
}

// partition takes the target's link down, and up when healed.
type partition struct {
	p    Planned
	lab  *netnsLab
	host int
}

func (f *partition) Inject(ctx context.Context, env *Env) (string, error) {
	if f.p.Duration <= 0 {
		return "", errors.New("a partition needs a duration before its link comes back up")
	}
	s, err := labOf(env)
	if err != nil {
		return "", err
	}
	if f.host, err = s.hostOf(env); err != nil {
		return "", err
	}
	if err := s.lab.LinkDown(ctx, f.host); err != nil {
		return "", err
	}
	f.lab = s
	h := s.lab.Host(f.host)
	return fmt.Sprintf("link of rank %d's host %s (%s) down for %s", env.Rank, h.Name(), h.Addr(), time.Duration(f.p.Duration)), nil
}

func (f *partition) Heal(ctx context.Context, _ *Env) (string, error) {
	if f.lab == nil {
		return "", nil
	}
	if err := f.lab.lab.LinkUp(ctx, f.host); err != nil {
		return "", err
	}
	return fmt.Sprintf("link of host %s up", f.lab.lab.Host(f.host).Name()), nil
}

// linkFault sets faults on every connection of the target's data plane:
// those into it (the proxy in front of it) and those it dialed (the
// others' proxies, for connections from its address).
type linkFault struct {
	p       Planned
	what    string
	f       ProxyFaults
	lab     *netnsLab
	host    int
	before  ProxyStats
	applied bool
}

func (f *linkFault) Inject(_ context.Context, env *Env) (string, error) {
	if f.p.Duration <= 0 {
		return "", fmt.Errorf("a %s link needs a duration", f.what)
	}
	s, err := labOf(env)
	if err != nil {
		return "", err
	}
	if f.host, err = s.hostOf(env); err != nil {
		return "", err
	}
	f.lab, f.applied = s, true
	f.before = s.linkStats()
	f.set(f.f)
	h := s.lab.Host(f.host)
	return fmt.Sprintf("%s link of rank %d (host %s, %s) for %s: every connection of its data plane through its own proxy and from it through the others' (delay %s, rate %d B/s, loss %.0f%% held %s)",
		f.what, env.Rank, h.Name(), h.Addr(), time.Duration(f.p.Duration), f.f.Delay, f.f.Rate, f.f.Loss*100, f.f.LossDelay), nil
}

// set applies pf to the target's link (zero: clears it).
func (f *linkFault) set(pf ProxyFaults) {
	addr := f.lab.lab.Host(f.host).Addr()
	for i, p := range f.lab.proxies {
		if i == f.host {
			p.Set(pf)
		} else {
			p.SetFrom(addr, pf)
		}
	}
}

func (f *linkFault) Heal(context.Context, *Env) (string, error) {
	if !f.applied {
		return "", nil
	}
	f.set(ProxyFaults{})
	a := f.lab.linkStats()
	return fmt.Sprintf("link of host %s clean again; meanwhile the lab's proxies forwarded %d bytes and held %d chunks for a retransmission",
		f.lab.lab.Host(f.host).Name(), a.Forwarded-f.before.Forwarded, a.Lost-f.before.Lost), nil
}

// linkStats sums the stats of the lab's proxies.
func (s *netnsLab) linkStats() ProxyStats {
	var t ProxyStats
	for _, p := range s.proxies {
		st := p.Stats()
		t.Conns += st.Conns
		t.Forwarded += st.Forwarded
		t.Lost += st.Lost
	}
	return t
}

// netnsScenarios are the built-in scenarios of network faults.
func netnsScenarios() []Scenario {
	inLab := func(j JobSpec) JobSpec { j.Network = "netns"; return j }
	return []Scenario{
		{Name: "partition-short", CI: true,
			Description: "the link of a worker's network namespace down for 1.5s (under the lease and the operation timeout), then up: the ring waits, the model is the undisturbed one bitwise",
			Job:         inLab(wholeRing(smallJob(3, 0))),
			Faults:      []FaultSpec{{Kind: "partition", Target: "rank:1", Trigger: Trigger{Step: 30}, Duration: Duration(1500 * time.Millisecond)}}},
		{Name: "partition-long", CI: true,
			Description: "the link of a worker's network namespace down for 8s (past the 5s lease): the ring closes without it and trains on; its link comes back up",
			Job:         inLab(smallJob(3, 0)),
			Faults:      []FaultSpec{{Kind: "partition-long", Target: "rank:2", Trigger: Trigger{Step: 30}, Duration: Duration(8 * time.Second)}}},
		{Name: "slow-link", CI: true,
			Description: "a worker's data plane behind a slow link (20ms per chunk, 2 MB/s) for 3s: the ring slows, the model is the undisturbed one bitwise",
			Job:         inLab(wholeRing(smallJob(3, 0))),
			Faults:      []FaultSpec{{Kind: "slow-link", Target: "rank:2", Trigger: Trigger{Step: 30}, Duration: Duration(3 * time.Second)}}},
		{Name: "lossy-link", CI: true,
			Description: "a worker's data plane behind a lossy link (30% of chunks held 200ms) for 3s: the ring slows, the model is the undisturbed one bitwise",
			Job:         inLab(wholeRing(smallJob(3, 0))),
			Faults:      []FaultSpec{{Kind: "lossy-link", Target: "rank:0", Trigger: Trigger{Step: 30}, Duration: Duration(3 * time.Second)}}},
	}
}
