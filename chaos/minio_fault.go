package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// minioEvidenceWait bounds how long an outage is stretched past its
// duration waiting for a worker's request to hit it.
const minioEvidenceWait = 30 * time.Second

// minioFault takes MinIO away for at least its duration and until a
// worker's request has met the outage (refused on the held port, or
// waiting on the paused server): so that the fault is sure to overlap an
// upload, however fast the job's checkpoints are. The outage runs on a
// goroutine of its own, not the run's scheduler: the scheduler may itself
// be waiting on the store (it reads each new checkpoint's manifest).
type minioFault struct {
	dur   time.Duration
	pause bool

	srv  *minioServer
	gate *uploadGate // nil, or the gate relaying the workers' requests
	pid  int
	hold net.Listener
	done chan struct{}

	mu       sync.Mutex
	workers  map[int64]int // worker pid → its requests that met the outage
	others   int           // requests of other processes (the harness)
	seen     map[string]bool
	hit      chan struct{} // closed at the first worker request
	healWhat string
	healErr  error
	back     time.Time // when MinIO answered again
}

func (f *minioFault) Inject(ctx context.Context, env *Env) (string, error) {
	srv, ok := env.Service("minio").(*minioServer)
	if !ok {
		return "", errors.New("the run has no MinIO (job.store minio)")
	}
	f.srv, f.workers, f.seen, f.hit, f.done = srv, map[int64]int{}, map[string]bool{}, make(chan struct{}), make(chan struct{})
	f.gate = env.run.gate()
	started := slices.Clone(env.Started)
	var what string
	if f.pause {
		pid, err := srv.signal(syscall.SIGSTOP)
		if err != nil {
			return "", err
		}
		f.pid = pid
		what = fmt.Sprintf("SIGSTOP to MinIO (pid %d) on %s", pid, srv.endpoint)
	} else {
		pid, err := srv.kill(ctx)
		if err != nil {
			return "", err
		}
		f.pid = pid
		// Hold the port: nothing else takes it before the restart, and
		// each connection a client makes meanwhile is seen (and reset).
		hold, err := net.Listen("tcp", srv.endpoint)
		if err != nil {
			_, serr := srv.start(context.WithoutCancel(ctx))
			return "", errors.Join(fmt.Errorf("holding MinIO's port %s after SIGKILL to pid %d: %w", srv.endpoint, pid, err), serr)
		}
		f.hold = hold
		go f.refuse(started)
		what = fmt.Sprintf("SIGKILL to MinIO (pid %d) on %s; its port held shut, every connection reset", pid, srv.endpoint)
	}
	go f.outage(ctx, started)
	return what, nil
}

// refuse accepts and resets every connection to the held port, noting
// whose it was.
func (f *minioFault) refuse(started []int64) {
	for {
		c, err := f.hold.Accept()
		if err != nil {
			return
		}
		socks, _ := readTCP()
		f.met(f.owner(socks, hexAddr(c.RemoteAddr().String()), started))
		resetClose(c)
	}
}

// owner is the worker (of pids) whose connection to MinIO comes from
// remote, directly or through the upload gate; 0 for none.
func (f *minioFault) owner(socks []tcpSocket, remote string, pids []int64) int64 {
	if f.gate != nil {
		if pid := f.gate.owner(socks, remote, pids); pid != 0 {
			return pid
		}
	}
	return ownerOf(socks, remote, hexAddr(f.srv.endpoint), pids)
}

// met records a request that met the outage, from pid (0: not a worker).
func (f *minioFault) met(pid int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if pid == 0 {
		f.others++
		return
	}
	if len(f.workers) == 0 {
		close(f.hit)
	}
	f.workers[pid]++
}

// outage waits for the duration and a worker's request (within
// minioEvidenceWait more), then brings MinIO back.
func (f *minioFault) outage(ctx context.Context, started []int64) {
	defer close(f.done)
	t0 := time.Now()
	end := time.NewTimer(f.dur)
	limit := time.NewTimer(f.dur + minioEvidenceWait)
	defer end.Stop()
	defer limit.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	hit, ended := f.hit, false
wait:
	for {
		select {
		case <-end.C:
			ended = true
		case <-hit:
			hit = nil
		case <-tick.C:
			if f.pause {
				f.pollStuck(started)
			}
			continue
		case <-limit.C:
			break wait
		case <-ctx.Done():
			break wait
		}
		if ended && hit == nil {
			break
		}
	}
	down := time.Since(t0)
	f.mu.Lock()
	met := fmt.Sprintf("%d requests of workers (pids %s) and %d of other processes", sum(f.workers), pidList(f.workers), f.others)
	f.mu.Unlock()
	back := context.WithoutCancel(ctx)
	if f.pause {
		if _, err := f.srv.signal(syscall.SIGCONT); err != nil {
			f.healErr = err
			return
		}
		f.setBack()
		f.healWhat = fmt.Sprintf("SIGCONT to MinIO (pid %d) after %.1fs paused; waiting on it: %s", f.pid, down.Seconds(), met)
		return
	}
	f.hold.Close()
	pid, err := f.srv.start(back)
	if err != nil {
		f.healErr = fmt.Errorf("restarting MinIO on %s: %w", f.srv.endpoint, err)
		return
	}
	f.setBack()
	f.healWhat = fmt.Sprintf("MinIO restarted (pid %d) on %s with the same data after %.1fs down; refused meanwhile: %s", pid, f.srv.endpoint, down.Seconds(), met)
}

// pollStuck notes the requests waiting unread on the paused server's
// connections.
func (f *minioFault) pollStuck(started []int64) {
	socks, err := readTCP()
	if err != nil {
		return
	}
	srv := hexAddr(f.srv.endpoint)
	for _, s := range socks {
		if s.local != srv || s.state != "01" || s.rxQueue == 0 {
			continue
		}
		f.mu.Lock()
		seen := f.seen[s.remote]
		f.seen[s.remote] = true
		f.mu.Unlock()
		if !seen {
			f.met(f.owner(socks, s.remote, started))
		}
	}
}

// Heal waits for the outage's end: MinIO back on its port.
func (f *minioFault) Heal(ctx context.Context, _ *Env) (string, error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return f.healWhat, f.healErr
}

func (f *minioFault) setBack() {
	f.mu.Lock()
	f.back = time.Now()
	f.mu.Unlock()
}

// backAt is when MinIO answered again (zero: not yet).
func (f *minioFault) backAt() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.back
}

// workerRequests is how many requests of workers met the outage.
func (f *minioFault) workerRequests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sum(f.workers)
}

func sum(m map[int64]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func pidList(m map[int64]int) string {
	var ps []int64
	for p := range m {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	var s []string
	for _, p := range ps {
		if p == viaGate {
			s = append(s, "unnamed, through the upload gate")
			continue
		}
		s = append(s, strconv.FormatInt(p, 10))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// tcpSocket is a line of /proc/net/tcp.
type tcpSocket struct {
	local, remote, state, inode string
	rxQueue                     uint64
}

// readTCP reads this network namespace's IPv4 TCP sockets.
func readTCP() ([]tcpSocket, error) {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	var out []tcpSocket
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		_, rx, _ := strings.Cut(f[4], ":")
		q, _ := strconv.ParseUint(rx, 16, 64)
		out = append(out, tcpSocket{local: f[1], remote: f[2], state: f[3], inode: f[9], rxQueue: q})
	}
	return out, nil
}

// hexAddr is an IPv4 host:port as /proc/net/tcp writes it ("" if not).
func hexAddr(hostport string) string {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return ""
	}
	ip := net.ParseIP(host).To4()
	p, err := strconv.Atoi(port)
	if ip == nil || err != nil {
		return ""
	}
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], p)
}

// socketOwner is which of pids owns the client end (at client, talking
// to server) of a loopback connection, or 0.
func socketOwner(client, server string, pids []int64) int64 {
	socks, err := readTCP()
	if err != nil {
		return 0
	}
	return ownerOf(socks, hexAddr(client), hexAddr(server), pids)
}

func ownerOf(socks []tcpSocket, client, server string, pids []int64) int64 {
	inode := ""
	for _, s := range socks {
		if s.local == client && s.remote == server {
			inode = s.inode
		}
	}
	if inode == "" || inode == "0" {
		return 0
	}
	want := "socket:[" + inode + "]"
	for _, pid := range pids {
		dir := "/proc/" + strconv.FormatInt(pid, 10) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
				return pid
			}
		}
	}
	return 0
}
