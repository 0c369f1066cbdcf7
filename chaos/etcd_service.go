package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	svcproc "github.com/phalanx-rt/phalanx/internal/services"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/coordinator"
)

// etcdMembers is the size of the cluster a job.etcd "cluster" runs on:
// three, so that one member lost (killed or stopped) keeps the quorum.
const etcdMembers = 3

// etcdCluster is the etcd service: three etcd members and the job's
// coordinators, each an OS process of this program (phalanx.Main runs
// their roles), on loopback ports chosen at start.
type etcdCluster struct {
	coordinators int
	dir          string
	log          *zap.Logger

	mu      sync.Mutex
	members []*serviceProc
	coords  []*serviceProc // every coordinator started, of every launch
	job     string         // the job the current coordinators serve
	failed  []string       // what could not be started (reported as leftovers)
	cli     *clientv3.Client
	ids     map[uint64]int // etcd member id → index
	ttl     time.Duration  // the job's lease TTL (the coordinators' leadership lease)
}

// serviceProc is one process of the service.
type serviceProc struct {
	name    string // m0..m2, or the coordinator's election id
	cmd     *exec.Cmd
	pid     int
	done    chan struct{} // closed once reaped
	dir     string        // an etcd member's data directory
	member  svcproc.EtcdMember
	client  string // an etcd member's client endpoint
	id      uint64 // an etcd member's id
	stopped bool   // SIGSTOPped by a fault, not continued yet
	killed  bool
}

func (p *serviceProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// etcdService is the 3-member external etcd cluster and the coordinator
// processes a scenario with job.etcd "cluster" runs against (nil: none).
func etcdService(sc *Scenario) (Service, error) {
	if sc.Job.Etcd != "cluster" {
		return nil, nil
	}
	n := sc.Job.Coordinators
	if n == 0 {
		n = 2
	}
	if n < 1 || n > 8 {
		return nil, fmt.Errorf("%w %q: job.coordinators %d: want 1..8", ErrScenario, sc.Name, n)
	}
	return &etcdCluster{coordinators: n}, nil
}

func (c *etcdCluster) Name() string { return "etcd" }

// freePorts holds n listeners on loopback at once (so that the ports
// differ), then frees them for etcd to bind a moment later.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// Start starts the three members and waits until each serves and the
// cluster answers.
func (c *etcdCluster) Start(ctx context.Context, dir string, log *zap.Logger) error {
	c.dir, c.log = dir, log
	ports, err := freePorts(2 * etcdMembers)
	if err != nil {
		return fmt.Errorf("loopback ports for etcd: %w", err)
	}
	var peers []string
	for i := range etcdMembers {
		peers = append(peers, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	var endpoints []string
	for i := range etcdMembers {
		m := svcproc.EtcdMember{Name: fmt.Sprintf("m%d", i), Dir: filepath.Join(dir, fmt.Sprintf("etcd-m%d", i)),
			ClientPort: ports[2*i], PeerPort: ports[2*i+1], InitialCluster: strings.Join(peers, ",")}
		c.members = append(c.members, &serviceProc{name: m.Name, dir: m.Dir, member: m,
			client: fmt.Sprintf("http://127.0.0.1:%d", m.ClientPort)})
		endpoints = append(endpoints, c.members[i].client)
	}
	// All three at once: none serves before a quorum has formed.
	errs := make([]error, etcdMembers)
	var wg sync.WaitGroup
	for i, m := range c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = c.startMember(ctx, m)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return err
	}
	if c.cli, err = coordinator.Connect(endpoints, nil, log); err != nil {
		c.Close()
		return err
	}
	c.ids = map[uint64]int{}
	for i, m := range c.members {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := c.cli.Status(sctx, m.client)
		cancel()
		if err != nil {
			c.Close()
			return fmt.Errorf("etcd member %s: %w", m.name, err)
		}
		m.id = st.Header.MemberId
		c.ids[m.id] = i
	}
	return nil
}

// startMember starts (or restarts, on its data) an etcd member and waits
// for its line saying it serves.
func (c *etcdCluster) startMember(ctx context.Context, m *serviceProc) error {
	cmd, err := svcproc.EtcdMemberCommand(m.member, "warn")
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := c.start(cmd, m, m.name); err != nil {
		return err
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			if !said && strings.HasPrefix(sc.Text(), svcproc.EtcdMemberServing) {
				said = true
				close(ready)
			}
		}
		io.Copy(io.Discard, out)
	}()
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-m.done:
		return fmt.Errorf("etcd member %s (pid %d) exited before serving: %v (log in %s)", m.name, m.pid, m.cmd.ProcessState, c.logPath(m.name))
	case <-t.C:
		return fmt.Errorf("etcd member %s (pid %d) not serving within a minute (log in %s)", m.name, m.pid, c.logPath(m.name))
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *etcdCluster) logPath(name string) string { return filepath.Join(c.dir, name+".log") }

// start starts p's command with its stderr in the service's log of name,
// and reaps it when it ends.
func (c *etcdCluster) start(cmd *exec.Cmd, p *serviceProc, name string) error {
	f, err := os.OpenFile(c.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	c.mu.Lock()
	p.cmd, p.pid, p.done, p.stopped, p.killed = cmd, cmd.Process.Pid, make(chan struct{}), false, false
	done := p.done
	c.mu.Unlock()
	go func() {
		cmd.Wait()
		f.Close()
		close(done)
	}()
	return nil
}

// Endpoints are the members' client endpoints.
func (c *etcdCluster) Endpoints() []string {
	var out []string
	for _, m := range c.members {
		out = append(out, m.client)
	}
	return out
}

// Configure points the launch at the cluster, without its own
// coordinator, and starts the job's coordinators (once per job name: a
// relaunch is a new job).
func (c *etcdCluster) Configure(lc *phalanx.LaunchConfig) {
	lc.Etcd = c.Endpoints()
	lc.NoCoordinator = true
	c.mu.Lock()
	same := c.job == lc.Job
	c.job = lc.Job
	c.ttl = lc.LeaseTTL
	c.mu.Unlock()
	if same {
		return
	}
	for i := range c.coordinators {
		id := fmt.Sprintf("coordinator-%d", i)
		cmd, err := svcproc.CoordinatorCommand(svcproc.CoordinatorProcess{Job: lc.Job, Etcd: lc.Etcd, ID: id,
			MinWorkers: lc.MinWorkers, MaxWorkers: lc.MaxWorkers, MinWorkersTimeout: lc.MinWorkersTimeout,
			JoinWindow: lc.JoinWindow, LeaseTTL: lc.LeaseTTL}, "info")
		p := &serviceProc{name: id}
		if err == nil {
			err = c.start(cmd, p, lc.Job+"-"+id)
		}
		if err != nil {
			// The launch must not wait for a coordinator that is not
			// there: it runs its own, and invariant 7 names the failure.
			c.log.Error("chaos: a coordinator process did not start", zap.String("id", id), zap.Error(err))
			c.mu.Lock()
			c.failed = append(c.failed, fmt.Sprintf("coordinator %s of %s did not start: %v", id, lc.Job, err))
			c.mu.Unlock()
			lc.NoCoordinator = false
			continue
		}
		c.mu.Lock()
		c.coords = append(c.coords, p)
		c.mu.Unlock()
	}
}

// coordinator is the current job's coordinator process of election id id.
func (c *etcdCluster) coordinator(id string) *serviceProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.coords) - 1; i >= 0; i-- {
		if c.coords[i].name == id {
			return c.coords[i]
		}
	}
	return nil
}

// Leftovers are the member and coordinator processes still alive and the
// members' data directories still there, and whatever could not start.
func (c *etcdCluster) Leftovers() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]string(nil), c.failed...)
	for _, p := range append(append([]*serviceProc(nil), c.members...), c.coords...) {
		if p.done == nil {
			continue
		}
		if p.alive() || syscall.Kill(p.pid, 0) == nil {
			out = append(out, fmt.Sprintf("process %s (pid %d) still exists", p.name, p.pid))
		}
	}
	for _, m := range c.members {
		if _, err := os.Stat(m.dir); err == nil {
			out = append(out, "etcd data directory "+m.dir)
		}
	}
	return out
}

// Close kills and reaps every process, and removes the members' data.
func (c *etcdCluster) Close() error {
	if c.cli != nil {
		c.cli.Close()
		c.cli = nil
	}
	c.mu.Lock()
	procs := append(append([]*serviceProc(nil), c.coords...), c.members...)
	c.mu.Unlock()
	for _, p := range procs {
		if p.done != nil && p.alive() {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	var errs []error
	for _, p := range procs {
		if p.done != nil {
			<-p.done
		}
	}
	for _, m := range c.members {
		if err := os.RemoveAll(m.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
