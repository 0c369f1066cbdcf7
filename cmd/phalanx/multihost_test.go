package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math"
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

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/internal/jobtest"
	"github.com/phalanx-rt/phalanx/internal/minioserver"
	"github.com/phalanx-rt/phalanx/internal/miniotest"
	"github.com/phalanx-rt/phalanx/internal/netns"
	"github.com/phalanx-rt/phalanx/internal/testwait"
	"github.com/phalanx-rt/phalanx/pki"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// The multi-host job: its training flags, every worker's, and its
// services' ports, the same on every host (each host is a network
// namespace of its own, so no port is taken there).
const (
	labSteps    = 300
	labEvery    = 10 // --checkpoint-every-steps
	labEtcd     = 2379
	labEtcdPeer = 2380
	labMinIO    = 9000
	labLease    = "5s"
	labWait     = 2 * time.Minute // bound of each wait on the job
)

var labTrain = []string{"--example", "mlp", "--hidden", "16", "--samples", "4096", "--batch", "96", "--steps", fmt.Sprint(labSteps),
	"--seed", "5", "--threads", "1", "--checkpoint-every-steps", fmt.Sprint(labEvery), "--lease-ttl", labLease, "--json"}

// TestSeveralHosts runs a job as an operator runs it on three hosts, by
// hand: three network namespaces of a lab (internal/netns) are the hosts;
// each runs a member of a 3-member etcd cluster (phalanx etcd) and two
// workers (phalanx worker, one bound to the host's address, one to every
// interface and advertising the host's address); host 0 runs the
// coordinator (phalanx coordinator), host 1 MinIO, where checkpoints go.
// Every process runs inside a namespace and every address it is given is
// a lab address: the job's traffic never leaves the lab. Every phalanx
// process has its host's certificate from phalanx certs init (mutual TLS):
// etcd refuses a plaintext client, and every worker's data plane and
// control plane answer a TLS handshake with its host's certificate.
//
// The job trains in a ring of 6; host 2's two workers are SIGKILLed, and
// the four others train on from memory in a ring of 4, the next
// generation (both losses found at once). Then all four are SIGKILLed,
// and four workers started again on hosts 0 and 1 only resume from the
// newest checkpoint in MinIO and finish the job, every step of it, with
// finite held-out loss and the same parameters on every rank. The time
// from the first kill to the next step is logged, not asserted.
func TestSeveralHosts(t *testing.T) {
	lab := netns.Start(t, 3)
	j := newLabJob(t, lab, miniotest.RequireBinary(t))
	j.startEtcd()
	j.etcdRefusesPlaintext()
	j.startMinIO(1)
	coord, coordWait := j.startCoordinator(0)

	// The first workers pause halfway through the job, for longer than the
	// test takes to kill them all: the job cannot end before.
	var ws []*labWorker
	hold := fmt.Sprintf("rank=0,at=%d,for=20s", labSteps/2)
	for host := range 3 {
		ws = append(ws, j.startWorker(host, false, "--inject-pause", hold), j.startWorker(host, true, "--inject-pause", hold))
	}
	before := j.until("a step in a ring of 6", func(r labReport) bool { return r.isStep(6) && num(r.r, "step") >= 20 })

	// The ring is held while the test looks at it: every step waits for
	// every worker, so one frozen worker holds them all. Host 2's are
	// frozen while the others' planes are probed, then the others while
	// host 2's are; then host 2's die, and are gone before the others
	// thaw.
	survivors, lost := ws[:4], ws[4:]
	jobtest.Freeze(t, pids(lost)...)
	g := j.checkRing(ws)
	j.checkTLS(g, survivors)
	jobtest.Freeze(t, pids(survivors)...)
	jobtest.Thaw(pids(lost)...)
	j.checkTLS(g, lost)
	for _, w := range lost {
		jobtest.Kill(t, w.pid, syscall.SIGKILL)
	}
	killed := time.Now()
	for _, w := range lost {
		w.gone(t)
	}
	jobtest.Thaw(pids(survivors)...)
	ring := j.until("the ring of 4", func(r labReport) bool { return r.kind() == "restored" && num(r.r, "world") == 4 })
	first := j.until("a step in a ring of 4", func(r labReport) bool { return r.isStep(4) })
	t.Logf("host 2's workers SIGKILLed: the ring of 4 resumed at step %d %.3fs later, its first step (%d) %.3fs after the kill",
		num(ring.r, "step"), ring.at.Sub(killed).Seconds(), num(first.r, "step"), first.at.Sub(killed).Seconds())
	if plane, _ := ring.r["data_plane"].(string); !strings.HasPrefix(plane, "hierarchical") {
		t.Errorf("the ring of 4 (two workers on each of two hosts) reaches its peers by %q, want hierarchical (shared memory within a host)", plane)
	}
	if num(ring.r, "step") < num(before.r, "step") {
		t.Errorf("the ring of 4 resumed at step %d, behind step %d trained before the kill", num(ring.r, "step"), num(before.r, "step"))
	}
	if num(ring.r, "generation") != num(before.r, "generation")+1 {
		t.Errorf("the ring of 4 is generation %d, the ring of 6 was %d: the host's two workers did not leave in one generation",
			num(ring.r, "generation"), num(before.r, "generation"))
	}
	saved := j.until("a checkpoint saved by the ring of 4, two periods after its first step", func(r labReport) bool {
		return r.saved() && num(r.ck(), "world_after") == 4 && num(r.r, "step") >= num(first.r, "step")+2*labEvery
	})

	// Every worker dies; what they printed before is all read.
	jobtest.Freeze(t, pids(survivors)...)
	for _, w := range survivors {
		jobtest.Kill(t, w.pid, syscall.SIGKILL)
	}
	for _, w := range survivors {
		w.gone(t)
	}
	j.drain()
	lastSaved, lastStep := num(saved.r, "step"), 0
	for _, r := range j.seen {
		if r.saved() {
			lastSaved = max(lastSaved, num(r.r, "step"))
		}
		if r.isStep(0) {
			lastStep = max(lastStep, num(r.r, "step"))
		}
	}
	for _, r := range j.seen {
		if r.kind() == "checkpoint" && r.ck()["kind"] == "restored" {
			t.Errorf("a checkpoint was restored before every worker was lost (the survivors hold the state): %s: %v", r.worker, r.r)
		}
	}
	if lastStep >= labSteps {
		t.Fatalf("the job reached step %d of %d before its workers were killed", lastStep, labSteps)
	}
	t.Logf("every worker SIGKILLed after step %d (of %d), the newest checkpoint reported of step %d", lastStep, labSteps, lastSaved)
	j.noRegistrations()

	// Hosts 0 and 1 start workers again: they resume from MinIO.
	var again []*labWorker
	for host := range 2 {
		again = append(again, j.startWorker(host, false), j.startWorker(host, true))
	}
	restored := j.until("a restore from the checkpoint in MinIO", func(r labReport) bool {
		return r.kind() == "checkpoint" && r.ck()["kind"] == "restored"
	})
	if st := num(restored.r, "step"); st < lastSaved || st > lastStep || st%labEvery != 0 || num(restored.ck(), "world_before") != 4 {
		t.Errorf("restored %v; want the newest checkpoint, written by the ring of 4: of step %d (the last reported saved) or one of its"+
			" successors up to step %d (the last trained)", restored.r, lastSaved, lastStep)
	}
	next := j.until("a step after the restore", func(r labReport) bool { return r.isStep(0) })
	if num(next.r, "step") != num(restored.r, "step")+1 {
		t.Errorf("the first step after the restore of step %d is %v", num(restored.r, "step"), next.r)
	}
	done := j.until("the job's end", func(r labReport) bool { return r.kind() == "done" })
	loss := done.r["loss"].(float64)
	if num(done.r, "step") != labSteps || num(done.r, "world") != 4 || done.r["identical"] != true || math.IsNaN(loss) || math.IsInf(loss, 0) {
		t.Errorf("done %v; want step %d in a ring of 4, identical parameters, a finite loss", done.r, labSteps)
	}
	for _, w := range again {
		if err := w.wait(); err != nil {
			t.Errorf("%s: %v", w.name, err)
		}
	}
	if err := coordWait(); err != nil {
		t.Errorf("the coordinator: %v", err)
	} else if !strings.Contains(coord.String(), "the job is done") {
		t.Errorf("the coordinator exited without seeing the job done:\n%s", jobtest.LastLines(coord.String(), 20))
	}
}

// labJob is a job on the hosts of a lab, and what its workers report.
type labJob struct {
	t    *testing.T
	lab  *netns.Lab
	name string // the job's
	dir  string
	tls  []pki.Files // each host's mutual TLS files, by host
	// minioBin is the MinIO server; ckpt the checkpoint location on it,
	// env its credentials, as a worker's environment.
	minioBin, ckpt string
	env            []string
	etcd           []string // the members' client URLs
	reports        chan labReport
	seen           []labReport
	workers        int
}

// newLabJob makes the job's TLS material as an operator would, with
// phalanx certs init: a CA and a certificate per host, naming the job.
func newLabJob(t *testing.T, lab *netns.Lab, minioBin string) *labJob {
	t.Helper()
	j := &labJob{t: t, lab: lab, name: fmt.Sprintf("hosts-%d", time.Now().UnixNano()), dir: t.TempDir(), minioBin: minioBin,
		reports: make(chan labReport, 1<<14)}
	certs := filepath.Join(j.dir, "certs")
	var hosts []string
	for i := range lab.Len() {
		hosts = append(hosts, j.addr(i, 0))
		j.tls = append(j.tls, pki.Files{CA: filepath.Join(certs, "ca.pem"), Cert: filepath.Join(certs, hosts[i]+".pem"),
			Key: filepath.Join(certs, hosts[i]+"-key.pem")})
	}
	var out, errOut strings.Builder
	if err := runCommand(t, []string{"certs", "init", certs, "--job", j.name, "--hosts", strings.Join(hosts, ",")}, &out, &errOut); err != nil {
		t.Fatalf("phalanx certs init: %v\n%s%s", err, out.String(), errOut.String())
	}
	return j
}

// tlsFlags are the mutual TLS flags of a process on host i.
func (j *labJob) tlsFlags(i int) []string {
	f := j.tls[i]
	return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
}

// addr is host i's address, with port (0: none).
func (j *labJob) addr(i, port int) string {
	if port == 0 {
		return j.lab.Host(i).Addr().String()
	}
	return netip.AddrPortFrom(j.lab.Host(i).Addr(), uint16(port)).String()
}

// command is phalanx with args and host i's TLS flags, on host i.
func (j *labJob) command(i int, args ...string) *exec.Cmd {
	return commandIn(j.t, j.lab.Host(i), append(args, j.tlsFlags(i)...)...)
}

// process starts phalanx with args on host i (command), killed when the
// test ends.
func (j *labJob) process(i int, name string, args ...string) (*jobtest.Buffer, func() error) {
	return jobtest.Process(j.t, name, j.command(i, args...))
}

// startEtcd starts one etcd member on each host and waits until each
// serves (which needs the cluster's quorum).
func (j *labJob) startEtcd() {
	j.t.Helper()
	var cluster []string
	for i := range j.lab.Len() {
		cluster = append(cluster, fmt.Sprintf("m%d=https://%s", i, j.addr(i, labEtcdPeer)))
		j.etcd = append(j.etcd, "https://"+j.addr(i, labEtcd))
	}
	var outs []*jobtest.Buffer
	for i := range j.lab.Len() {
		out, _ := j.process(i, fmt.Sprintf("etcd member m%d", i), "etcd", "--name", fmt.Sprintf("m%d", i),
			"--dir", filepath.Join(j.dir, fmt.Sprintf("etcd-m%d", i)), "--host", j.addr(i, 0),
			"--client-port", fmt.Sprint(labEtcd), "--peer-port", fmt.Sprint(labEtcdPeer), "--initial-cluster", strings.Join(cluster, ","))
		outs = append(outs, out)
	}
	for i, out := range outs {
		testwait.Until(j.t, labWait, fmt.Sprintf("etcd member m%d to serve", i), func() bool {
			return strings.Contains(out.String(), "etcd endpoints: "+j.etcd[i])
		})
	}
}

// startMinIO starts MinIO on host i, waits until it answers healthy
// there, and points the job's checkpoints at it.
func (j *labJob) startMinIO(i int) {
	j.t.Helper()
	h := j.lab.Host(i)
	out := &jobtest.Buffer{}
	srv, err := minioserver.New(minioserver.Config{Binary: j.minioBin, Dir: filepath.Join(j.dir, "minio"), Endpoint: j.addr(i, labMinIO),
		AccessKey: "phalanx-lab", SecretKey: "phalanx-lab-secret", Output: out, Command: h.Command, Dial: h.DialContext})
	if err != nil {
		j.t.Fatal(err)
	}
	j.t.Cleanup(func() {
		srv.Stop()
		if j.t.Failed() {
			j.t.Logf("MinIO output:\n%s", jobtest.LastLines(out.String(), 30))
		}
	})
	if _, err := srv.Start(testContext(j.t, labWait)); err != nil {
		j.t.Fatal(err)
	}
	ak, sk := srv.Credentials()
	j.env = []string{"AWS_ACCESS_KEY_ID=" + ak, "AWS_SECRET_ACCESS_KEY=" + sk}
	// MinIO serves plain HTTP here; a lab address is not loopback, where
	// that is the default.
	j.ckpt = fmt.Sprintf("s3://phalanx/%s?endpoint=%s&tls=false", j.name, srv.Endpoint())
}

// startCoordinator starts the job's coordinator on host i, told to
// expect the six workers.
func (j *labJob) startCoordinator(i int) (*jobtest.Buffer, func() error) {
	out, wait := j.process(i, "coordinator", "coordinator", "--etcd-endpoints", strings.Join(j.etcd, ","), "--job", j.name,
		"--workers", "6", "--min-workers", "2", "--max-workers", "6")
	return out, wait
}

// labWorker is a worker process started by hand on a host.
type labWorker struct {
	name    string
	host    int
	pid     int
	wait    func() error
	drained chan struct{} // closed once its stdout is read to the end
}

// startWorker starts a worker on host i, with flags extra: bound to the
// host's address, or (anyAddr) to every interface, advertising the host's
// address. Its reports (one JSON object a line on stdout) go to j.reports.
func (j *labJob) startWorker(i int, anyAddr bool, extra ...string) *labWorker {
	j.t.Helper()
	j.workers++
	w := &labWorker{name: fmt.Sprintf("worker %d (host %d)", j.workers, i), host: i, drained: make(chan struct{})}
	bind := []string{"--bind", j.addr(i, 0) + ":0"}
	if anyAddr {
		bind = []string{"--bind", "0.0.0.0:0", "--advertise", j.addr(i, 0)}
	}
	args := append(append([]string{"worker", "--etcd-endpoints", strings.Join(j.etcd, ","), "--job", j.name, "--checkpoint", j.ckpt},
		labTrain...), append(bind, extra...)...)
	r, pw, err := os.Pipe()
	if err != nil {
		j.t.Fatal(err)
	}
	cmd := j.command(i, args...)
	cmd.Env = append(cmd.Env, j.env...)
	cmd.Stdout = pw
	lines := &jobtest.Buffer{}
	_, w.wait = jobtest.Process(j.t, w.name, cmd)
	pw.Close()
	w.pid = cmd.Process.Pid
	go func() {
		defer close(w.drained)
		defer r.Close()
		jobtest.Decode(r, func(e jobtest.Event) {
			line, _ := json.Marshal(e)
			lines.Write(append(line, '\n'))
			j.reports <- labReport{worker: w.name, at: time.Now(), r: e}
		})
	}()
	j.t.Cleanup(func() {
		if j.t.Failed() {
			j.t.Logf("%s reports:\n%s", w.name, jobtest.LastLines(lines.String(), 15))
		}
	})
	return w
}

// gone waits until the killed worker has exited and its reports are read.
func (w *labWorker) gone(t *testing.T) {
	t.Helper()
	if err := w.wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("%s (pid %d), SIGKILLed: %v", w.name, w.pid, err)
	}
	testwait.Recv(t, w.drained, labWait, w.name+"'s output to close")
}

// labReport is a report a worker printed, with the time it was read.
type labReport struct {
	worker string
	at     time.Time
	r      jobtest.Event
}

func (r labReport) kind() string { s, _ := r.r["kind"].(string); return s }

// isStep: a step trained in a ring of world workers (0: any), not one
// reported again after a ring change.
func (r labReport) isStep(world int) bool {
	return r.kind() == "step" && r.r["replayed"] != true && (world == 0 || num(r.r, "world") == world)
}

// ck is a checkpoint report's event.
func (r labReport) ck() jobtest.Event { e, _ := r.r["checkpoint"].(map[string]any); return e }

// saved: a checkpoint was saved.
func (r labReport) saved() bool { return r.kind() == "checkpoint" && r.ck()["kind"] == "saved" }

// num is e's numeric field k (0 when absent).
func num(e jobtest.Event, k string) int { f, _ := e[k].(float64); return int(f) }

// until reads the workers' reports until one satisfies pred, and returns
// it; it fails the test on a worker's failure report, or when none comes
// within labWait.
func (j *labJob) until(what string, pred func(labReport) bool) labReport {
	j.t.Helper()
	timer := time.NewTimer(labWait)
	defer timer.Stop()
	for {
		select {
		case r := <-j.reports:
			j.seen = append(j.seen, r)
			if r.kind() == "failed" || r.r["event"] == "garbage" {
				j.t.Fatalf("waiting for %s: %s said %v", what, r.worker, r.r)
			}
			if pred(r) {
				return r
			}
		case <-timer.C:
			j.t.Fatalf("waited %v for %s; last reports:\n%s", labWait, what, j.last(12))
		}
	}
}

// drain reads the reports already printed.
func (j *labJob) drain() {
	for {
		select {
		case r := <-j.reports:
			j.seen = append(j.seen, r)
		default:
			return
		}
	}
}

// last is the last n reports read, one a line.
func (j *labJob) last(n int) string {
	var b strings.Builder
	for _, r := range j.seen[max(0, len(j.seen)-n):] {
		line, _ := json.Marshal(r.r)
		fmt.Fprintf(&b, "%s: %s\n", r.worker, line)
	}
	return b.String()
}

// etcdClient is a client of the job's etcd that dials from inside host
// 0's namespace (this process's own has no route to the lab), over the
// job's mutual TLS, or (plain) over plaintext, which the members refuse.
func (j *labJob) etcdClient(plain bool) *coordinator.Job {
	j.t.Helper()
	h := j.lab.Host(0)
	cfg := clientv3.Config{Endpoints: j.etcd, DialTimeout: 10 * time.Second, TLS: j.material().Client(j.name),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return h.DialContext(ctx, "tcp", addr)
		})}}
	if plain {
		cfg.TLS, cfg.Endpoints = nil, nil
		for _, e := range j.etcd {
			cfg.Endpoints = append(cfg.Endpoints, "http://"+strings.TrimPrefix(e, "https://"))
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		j.t.Fatal(err)
	}
	j.t.Cleanup(func() { cli.Close() })
	keys, err := coordinator.KeysFor(j.name)
	if err != nil {
		j.t.Fatal(err)
	}
	return coordinator.NewJob(cli, keys)
}

// material is host 0's TLS material, as the test's own client's.
func (j *labJob) material() *pki.Material {
	j.t.Helper()
	m, err := pki.Load(j.tls[0], j.name, nil)
	if err != nil {
		j.t.Fatal(err)
	}
	return m
}

// etcdRefusesPlaintext: the members serve only TLS clients.
func (j *labJob) etcdRefusesPlaintext() {
	j.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := j.etcdClient(true).Client().Get(ctx, "/"); err == nil {
		j.t.Errorf("etcd answered a plaintext client at %v", j.etcd)
	}
}

// checkTLS: the workers ws, members of ring g, speak TLS on their data
// plane and their control plane (the actor remote, gRPC), each with the
// certificate of its own host.
func (j *labJob) checkTLS(g *phalanxpb.Generation, ws []*labWorker) {
	j.t.Helper()
	ctx := testContext(j.t, labWait)
	h, m := j.lab.Host(0), j.material()
	for _, w := range ws {
		i := slices.IndexFunc(g.GetMembers(), func(m *phalanxpb.Member) bool { return m.Pid == int64(w.pid) })
		if i < 0 {
			j.t.Fatalf("%s (pid %d) is not in the ring %v", w.name, w.pid, g.GetMembers())
		}
		mem, host := g.GetMembers()[i], j.lab.Host(w.host)
		for _, plane := range []struct{ name, addr, alpn string }{{"data plane", mem.DataAddr, ""}, {"control plane", mem.ControlAddr, "h2"}} {
			c, err := h.DialContext(ctx, "tcp", plane.addr)
			if err != nil {
				j.t.Fatalf("%s's %s at %s: %v", w.name, plane.name, plane.addr, err)
			}
			cfg := m.Client(j.name)
			if plane.alpn != "" {
				cfg.NextProtos = []string{plane.alpn}
			}
			tc := tls.Client(c, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				j.t.Errorf("%s's %s at %s: a TLS handshake with the job's certificate: %v", w.name, plane.name, plane.addr, err)
			} else if leaf := tc.ConnectionState().PeerCertificates[0]; !slices.ContainsFunc(leaf.IPAddresses, func(ip net.IP) bool {
				a, _ := netip.AddrFromSlice(ip)
				return a.Unmap() == host.Addr()
			}) {
				j.t.Errorf("%s's %s at %s presents a certificate for %v, not for its host %s", w.name, plane.name, plane.addr,
					leaf.IPAddresses, host.Addr())
			}
			tc.Close()
		}
	}
}

// checkRing: the current ring (returned) holds the six workers, each
// advertising its own host's lab address for its data and control planes.
func (j *labJob) checkRing(ws []*labWorker) *phalanxpb.Generation {
	j.t.Helper()
	g, _, err := j.etcdClient(false).CurrentGeneration(testContext(j.t, labWait))
	if err != nil {
		j.t.Fatal(err)
	}
	hostOf := map[int64]int{}
	for _, w := range ws {
		hostOf[int64(w.pid)] = w.host
	}
	if len(g.GetMembers()) != len(ws) {
		j.t.Fatalf("the ring %v; want the %d workers", g.GetMembers(), len(ws))
	}
	for _, m := range g.GetMembers() {
		host, ok := hostOf[m.Pid]
		if !ok {
			j.t.Fatalf("ring member %v is none of the workers started", m)
		}
		for _, a := range []string{m.DataAddr, m.ControlAddr} {
			ap, err := netip.ParseAddrPort(a)
			if err != nil || ap.Addr() != j.lab.Host(host).Addr() {
				j.t.Errorf("ring member pid %d (on host %d) advertises %q; want its host's address %s (the lab is %s)", m.Pid, host,
					a, j.lab.Host(host).Addr(), j.lab.Subnet())
			}
		}
	}
	return g
}

// noRegistrations waits until the killed workers' registrations have
// expired (within their lease), so that the workers started next meet
// no dead peer in their first ring.
func (j *labJob) noRegistrations() {
	j.t.Helper()
	job := j.etcdClient(false)
	testwait.Until(j.t, labWait, "the killed workers' registrations to expire", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := job.Client().Get(ctx, job.Keys().Workers(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			j.t.Logf("reading the registrations: %v", err)
			return false
		}
		return resp.Count == 0
	})
}

func pids(ws []*labWorker) []int {
	var out []int
	for _, w := range ws {
		out = append(out, w.pid)
	}
	return out
}
