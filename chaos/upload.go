package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
)

// The "during a checkpoint upload" trigger. A checkpoint of a small job
// uploads in milliseconds, far quicker than any scheduler could aim a
// fault at it. So the workers reach MinIO through an upload gate, a TCP
// relay of ours: when a worker's connection starts a PUT of an object
// under the run's checkpoint prefix and an upload-triggered fault is
// pending, the gate holds that request's first bytes, the scheduler
// injects the fault, and only then does the gate let the bytes on. The
// fault lands in the middle of a real upload, however small.

// gateSource is the loopback address the gate dials MinIO from: a
// connection to MinIO from it is a worker's, relayed (the harness's own
// requests come from 127.0.0.1).
const gateSource = "127.0.0.2"

// uploadHoldLimit bounds how long the gate holds a request for the
// scheduler (which could be between launches).
const uploadHoldLimit = 30 * time.Second

// uploadHit is a held upload: the worker connection's address, the
// object's path, and release, closed by the scheduler once it has fired.
type uploadHit struct {
	client  string // the worker's end of its connection to the gate
	object  string
	release chan struct{}
}

// uploadGate relays workers' connections to MinIO and holds the first
// upload it sees while armed.
type uploadGate struct {
	store   storeService // MinIO, for its endpoint
	prefix  []byte       // "PUT /bucket/prefix/"
	ln      net.Listener
	target  string
	hits    chan *uploadHit
	closing chan struct{}
	log     *zap.Logger
	wg      sync.WaitGroup

	mu    sync.Mutex
	armed int               // upload-triggered faults not fired yet
	conns map[net.Conn]bool // open client connections
	peers map[string]string // gate→MinIO local address → the worker's address
}

// needsUploadGate says whether any of the scenario's faults is triggered
// by an upload.
func needsUploadGate(sc *Scenario) bool {
	for _, f := range sc.Faults {
		if f.Trigger.On == "upload" {
			return true
		}
	}
	return false
}

func newUploadGate(sc *Scenario, store storeService) *uploadGate {
	g := &uploadGate{store: store, hits: make(chan *uploadHit), closing: make(chan struct{}),
		conns: map[net.Conn]bool{}, peers: map[string]string{}}
	for _, f := range sc.Faults {
		if f.Trigger.On == "upload" {
			g.armed++
		}
	}
	return g
}

// Name: faults do not reach the gate by name.
func (g *uploadGate) Name() string { return "upload-gate" }

// Start listens on a loopback port chosen now and relays to MinIO.
func (g *uploadGate) Start(ctx context.Context, dir string, log *zap.Logger) error {
	url, _ := g.store.CheckpointLocation()
	bucketPath, query, _ := strings.Cut(strings.TrimPrefix(url, "s3://"), "?")
	ep, ok := strings.CutPrefix(query, "endpoint=")
	if !ok || ep == "" {
		return fmt.Errorf("the checkpoint location %q names no endpoint", url)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	g.ln, g.target, g.log = ln, ep, log.Named("upload-gate")
	g.prefix = []byte("PUT /" + strings.TrimSuffix(bucketPath, "/") + "/")
	g.wg.Add(1)
	go g.accept()
	return nil
}

// Configure sends the workers' S3 requests through the gate; the runner's
// own store still reaches MinIO directly.
func (g *uploadGate) Configure(lc *phalanx.LaunchConfig) {
	lc.Checkpoint.Location = strings.Replace(lc.Checkpoint.Location, "endpoint="+g.target, "endpoint="+g.ln.Addr().String(), 1)
}

// Leftovers: the gate's port must be shut.
func (g *uploadGate) Leftovers() []string {
	if g.ln == nil {
		return nil
	}
	if c, err := net.DialTimeout("tcp", g.ln.Addr().String(), time.Second); err == nil {
		c.Close()
		return []string{"the upload gate's port " + g.ln.Addr().String() + " still accepts connections"}
	}
	return nil
}

// Close stops accepting, resets every relayed connection and waits for
// the relays.
func (g *uploadGate) Close() error {
	if g.ln == nil {
		return nil
	}
	select {
	case <-g.closing:
		return nil
	default:
	}
	close(g.closing)
	g.ln.Close()
	g.mu.Lock()
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.wg.Wait()
	return nil
}

// Hits are the held uploads, for the scheduler.
func (g *uploadGate) Hits() <-chan *uploadHit { return g.hits }

// fired records that an upload-triggered fault was injected.
func (g *uploadGate) fired() {
	g.mu.Lock()
	g.armed--
	g.mu.Unlock()
}

// owner is which of pids a connection to MinIO from remote (as
// /proc/net/tcp writes it) was relayed for: 0 when it is not the gate's,
// viaGate when it is but its worker is not known (yet).
func (g *uploadGate) owner(socks []tcpSocket, remote string, pids []int64) int64 {
	if !strings.HasPrefix(remote, hexAddr(gateSource + ":0")[:8]) {
		return 0
	}
	g.mu.Lock()
	w, ok := g.peers[remote]
	g.mu.Unlock()
	if ok {
		if pid := ownerOf(socks, hexAddr(w), hexAddr(g.ln.Addr().String()), pids); pid != 0 {
			return pid
		}
	}
	return viaGate
}

// viaGate stands for a worker, unknown, whose request the gate relayed.
const viaGate = -1

func (g *uploadGate) accept() {
	defer g.wg.Done()
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		g.mu.Lock()
		g.conns[c] = true
		g.mu.Unlock()
		g.wg.Add(1)
		go g.relay(c)
	}
}

// relay carries one worker connection to MinIO and back.
func (g *uploadGate) relay(c net.Conn) {
	defer g.wg.Done()
	defer func() {
		g.mu.Lock()
		delete(g.conns, c)
		g.mu.Unlock()
	}()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(gateSource)}}
	up, err := d.Dial("tcp", g.target)
	if err != nil { // MinIO down: the worker sees the refusal as a reset
		resetClose(c)
		return
	}
	local := up.LocalAddr().String()
	g.mu.Lock()
	g.peers[hexAddr(local)] = c.RemoteAddr().String()
	g.conns[up] = true
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.conns, up)
		delete(g.peers, hexAddr(local))
		g.mu.Unlock()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(c, up)
		resetClose(c) // MinIO went: the worker must see its request fail
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			g.hold(c.RemoteAddr().String(), buf[:n])
			if _, werr := up.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	up.Close()
	<-done
}

// hold waits for the scheduler when chunk starts an upload and a fault
// waits for one.
func (g *uploadGate) hold(client string, chunk []byte) {
	if !bytes.HasPrefix(chunk, g.prefix) {
		return
	}
	g.mu.Lock()
	armed := g.armed > 0
	g.mu.Unlock()
	if !armed {
		return
	}
	line, _, _ := bytes.Cut(chunk, []byte(" HTTP/"))
	h := &uploadHit{client: client, object: string(bytes.TrimPrefix(line, []byte("PUT "))), release: make(chan struct{})}
	limit := time.NewTimer(uploadHoldLimit)
	defer limit.Stop()
	select {
	case g.hits <- h:
	case <-limit.C:
		g.log.Warn("no scheduler took a held upload; letting it through", zap.String("object", h.object))
		return
	case <-g.closing:
		return
	}
	select {
	case <-h.release:
	case <-limit.C:
		g.log.Warn("the scheduler did not release a held upload; letting it through", zap.String("object", h.object))
	case <-g.closing:
	}
}

// errNoUploader: an uploader-targeted fault whose upload came from no
// worker of the ring.
var errNoUploader = errors.New("the held upload came from no worker of the ring")

// uploadScenarios are the built-in scenarios triggered during a checkpoint
// upload.
func uploadScenarios() []Scenario {
	killJob := smallJob(3, 10)
	killJob.Store, killJob.MinWorkers = "minio", 2
	return []Scenario{
		{Name: "minio-stop-mid-upload", CI: true,
			Description: "MinIO SIGKILLed while a worker's checkpoint upload (the first at or after step 20) is held mid-request at the gate, " +
				"its port refusing for 1s, then restarted on the same data: the upload is retried, training goes on bitwise, every complete checkpoint verifies",
			Job:    minioJob(),
			Faults: []FaultSpec{{Kind: "minio-stop", Trigger: Trigger{On: "upload", Step: 20}, Duration: Duration(time.Second)}}},
		{Name: "kill-mid-upload", CI: true,
			Description: "SIGKILL of the worker whose checkpoint upload (the first at or after step 20) is held mid-request at the gate: " +
				"that checkpoint stays incomplete and never verifies as whole, the others close ranks and go on checkpointing",
			Job:    killJob,
			Faults: []FaultSpec{{Kind: "sigkill", Target: "uploader", Trigger: Trigger{On: "upload", Step: 20}}}},
	}
}
