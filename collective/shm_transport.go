package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// ShmOptions configure the shared-memory side of a transport. Zero values
// take the defaults.
//
// Memory cost, per host with L ranks of one group: every pair of them shares
// a segment of 8 KiB + 2×RingBytes, and every rank has one of 8 KiB +
// 2×SlabBytes, so L(L−1)/2·(2·RingBytes) + L·(2·SlabBytes) + 8 KiB·(L(L+1)/2)
// in all: about 38 MiB for four ranks with the defaults. The files live in Dir
// (tmpfs) only while the group is being connected; the memory is freed when
// the last rank unmaps it.
type ShmOptions struct {
	// Dir holds the segment files while peers map them (default /dev/shm).
	// Every rank of a host must use the same directory.
	Dir string
	// RingBytes is each direction's byte ring between two ranks (default
	// 512 KiB; rounded up to a power of two, at least 4 KiB). The rings carry
	// the operations other than the allreduce fast path, and heartbeats.
	RingBytes int
	// SlabBytes is the size of each of a rank's two fast-path slabs (default
	// 4 MiB, at least 4 KiB, rounded up to 64 bytes): an allreduce larger
	// than this is pipelined through the slabs in rounds. Each round costs
	// three waits, each a context switch when ranks outnumber cores, so
	// larger slabs are faster: on two cores with four ranks, 4 MiB slabs
	// gave 1.3–1.4× the busbw of 1 MiB ones at 16 and 64 MiB, and 256 KiB
	// slabs 0.6–0.7×.
	SlabBytes int
	// SmallBytes: fast-path rounds up to this size have every rank reduce the
	// whole round, one synchronisation instead of two (default 16 KiB).
	SmallBytes int
	// Spin is how many times a waiter polls a shared word before it yields
	// or sleeps on its futex; negative means never spin. 0 chooses: 200 for
	// the byte rings, and for the allreduce fast path by the ranks on the
	// host and its cores (see shmWait).
	Spin int
	// Yield is how many times a waiter then gives its core away
	// (sched_yield) and polls again before sleeping; negative means never.
	// 0 chooses: never for the byte rings, and for the fast path by the
	// ranks and the cores (see shmWait). It helps when the ranks are alone
	// on too few cores; when other work shares the cores it hurts (a
	// yielding rank queues behind it, where a sleeping one is woken first).
	Yield  int
	Logger *zap.Logger
}

func (o *ShmOptions) setDefaults() {
	if o.Dir == "" {
		o.Dir = "/dev/shm"
	}
	if o.RingBytes <= 0 {
		o.RingBytes = 512 << 10
	}
	ring := 4096
	for ring < o.RingBytes {
		ring *= 2
	}
	o.RingBytes = ring
	if o.SlabBytes <= 0 {
		o.SlabBytes = 4 << 20
	}
	o.SlabBytes = (max(o.SlabBytes, 4096) + 63) &^ 63
	if o.SmallBytes <= 0 {
		o.SmallBytes = 16 << 10
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
}

// ShmTransport connects ranks of one host through shared memory and the
// others through its TCP transport. It first connects every pair over TCP
// (which checks job, generation and world), then upgrades the pairs on one
// host: the two ranks map a pair segment of two byte rings and each other's
// rank segment, and the TCP connection stays open, idle, as the liveness
// signal. The upgraded connections are net.Conns, so framing, fencing,
// heartbeats and every algorithm work unchanged; when every peer is on
// shared memory, AllReduce takes a single-copy path through the rank
// segments.
type ShmTransport struct {
	kind TransportKind
	tcp  *TCPTransport
	opts ShmOptions
	log  *zap.Logger
}

// NewTransport returns the transport of kind over tcp, the rank's TCP
// transport (whose address is what Membership.Peers holds): tcp itself for
// TransportTCP, a *ShmTransport for TransportShm and TransportAuto.
func NewTransport(kind TransportKind, tcp *TCPTransport, opts ShmOptions) (Transport, error) {
	if tcp == nil {
		return nil, errors.New("collective: NewTransport needs the rank's TCP transport")
	}
	switch kind {
	case TransportTCP:
		return tcp, nil
	case TransportAuto, TransportShm:
	default:
		return nil, fmt.Errorf("collective: unknown transport kind %d", kind)
	}
	opts.setDefaults()
	if st, err := os.Stat(opts.Dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("collective: shared-memory directory %s is not usable: %v", opts.Dir, err)
	}
	return &ShmTransport{kind: kind, tcp: tcp, opts: opts, log: opts.Logger}, nil
}

// Connect implements Transport.
func (t *ShmTransport) Connect(ctx context.Context, m Membership) ([]net.Conn, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	local := make([]bool, m.World())
	anyLocal := false
	for j := range m.World() {
		if j == m.Rank {
			continue
		}
		if t.kind == TransportShm && len(m.Hosts) != 0 && !m.sameHost(m.Rank, j) {
			return nil, fmt.Errorf("collective: transport shm: rank %d is on host %q, this rank (%d) on %q", j, m.Hosts[j], m.Rank, m.Hosts[m.Rank])
		}
		local[j] = t.kind == TransportShm || m.sameHost(m.Rank, j)
		anyLocal = anyLocal || local[j]
	}
	if !anyLocal {
		return t.tcp.Connect(ctx, m)
	}
	job := JobHash(m.Job)
	t.sweep(job, m.Generation)
	nonce := rand.Uint64() | 1
	nodePath := filepath.Join(t.opts.Dir, rankSegName(job, m.Generation, m.Rank, nonce))
	mem, err := createSegment(nodePath, rankSegmentSize(t.opts.SlabBytes))
	if err != nil {
		return nil, &OpError{Op: "connect", Rank: -1, ReportedBy: m.Rank, Kind: ErrAborted, Err: err}
	}
	hdr := segHeader{kind: segKindRank, job: job, gen: m.Generation, a: uint32(m.Rank), world: uint32(m.World()),
		pid: uint32(os.Getpid()), ring: uint32(t.opts.RingBytes), slab: uint32(t.opts.SlabBytes), nonce: nonce}
	hdr.encode(mem, segMagic)
	node := &shmNode{mem: mem}
	node.refs.Store(1) // Connect's own, dropped below
	defer func() {
		unlinkMapped(nodePath) // every peer has mapped it, or never will
		node.release()
	}()

	conns, err := t.tcp.Connect(ctx, m)
	if err != nil {
		return nil, err
	}
	var (
		wg   sync.WaitGroup
		errs = make([]error, m.World())
	)
	ups := make([]*shmConn, m.World())
	for j := range m.World() {
		if local[j] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ups[j], errs[j] = t.upgrade(ctx, m, j, conns[j], node, nonce)
			}()
		}
	}
	wg.Wait()
	for j, u := range ups {
		if u != nil {
			conns[j] = u
		}
	}
	if err := errors.Join(errs...); err != nil {
		closeAll(conns)
		for _, e := range errs {
			if e != nil {
				return nil, e
			}
		}
	}
	return conns, nil
}

// sweep removes segment files left by ranks that died while connecting:
// those of older generations of the job, and those of any job whose
// creating process no longer exists (a job killed whole, with no survivor
// to rebuild).
func (t *ShmTransport) sweep(job, gen uint64) {
	prefix := fmt.Sprintf("phalanx-%016x-g", job)
	entries, err := os.ReadDir(t.opts.Dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "phalanx-") {
			continue
		}
		stale := false
		if rest, ok := strings.CutPrefix(name, prefix); ok {
			g, _, _ := strings.Cut(rest, "-")
			old, err := strconv.ParseUint(g, 10, 64)
			stale = err == nil && old < gen
		}
		path := filepath.Join(t.opts.Dir, name)
		if (stale || ownerGone(path)) && os.Remove(path) == nil {
			t.log.Info("removed a stale shared-memory segment", zap.String("file", name))
		}
	}
}

// ownerGone says whether the segment file at path has a valid header whose
// creating process no longer exists. A file whose header is not written yet
// (or is not ours) is left alone.
func ownerGone(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [ctrlSize]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return false
	}
	h, err := decodeSegHeader(b[:], segMagic)
	if err != nil || h.pid == 0 {
		return false
	}
	return syscall.Kill(int(h.pid), 0) == syscall.ESRCH
}

// upgrade turns the TCP connection to local peer j into a shmConn: the lower
// rank creates the pair segment, both exchange hellos naming their segments,
// map the peer's, confirm, and the creator unlinks the pair segment.
func (t *ShmTransport) upgrade(ctx context.Context, m Membership, j int, c net.Conn, node *shmNode, nonce uint64) (_ *shmConn, err error) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(kind error, detail string, cause error) error {
		return &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: kind,
			Detail: fmt.Sprintf("shared memory with rank %d: %s", j, detail), Err: cause}
	}
	job, gen := JobHash(m.Job), m.Generation
	lo, hi := min(m.Rank, j), max(m.Rank, j)
	ring, slab := t.opts.RingBytes, t.opts.SlabBytes
	var pair, peerSeg []byte
	defer func() {
		if err != nil {
			unmap(pair)
			unmap(peerSeg)
		}
	}()
	if m.Rank == lo {
		path := filepath.Join(t.opts.Dir, pairSegName(job, gen, lo, hi, nonce))
		if pair, err = createSegment(path, pairSegmentSize(ring)); err != nil {
			return nil, fail(ErrAborted, "creating the pair segment", err)
		}
		defer unlinkMapped(path) // mapped by the peer, or never will be
		h := segHeader{kind: segKindPair, job: job, gen: gen, a: uint32(lo), b: uint32(hi), world: uint32(m.World()),
			pid: uint32(os.Getpid()), ring: uint32(ring), slab: uint32(slab), nonce: nonce}
		h.encode(pair, segMagic)
	}
	var buf [ctrlSize]byte
	hello := segHeader{job: job, gen: gen, a: uint32(m.Rank), b: uint32(j), world: uint32(m.World()),
		pid: uint32(os.Getpid()), ring: uint32(ring), slab: uint32(slab), nonce: nonce}
	hello.encode(buf[:], helloMagic)
	if _, err := c.Write(buf[:]); err != nil {
		return nil, fail(ErrPeerLost, "sending the hello", err)
	}
	if _, err := io.ReadFull(c, buf[:]); err != nil {
		return nil, fail(ErrPeerLost, "reading the hello", err)
	}
	got, err := decodeSegHeader(buf[:], helloMagic)
	if err == nil {
		err = got.expect(segHeader{job: job, gen: gen, a: uint32(j), b: uint32(m.Rank), world: uint32(m.World()),
			ring: uint32(ring), slab: uint32(slab)})
	}
	if err != nil {
		return nil, fail(ErrProtocol, "bad hello", err)
	}
	if m.Rank == hi {
		path := filepath.Join(t.opts.Dir, pairSegName(job, gen, lo, hi, got.nonce))
		if pair, err = openMatching(path, pairSegmentSize(ring), segHeader{kind: segKindPair, job: job, gen: gen,
			a: uint32(lo), b: uint32(hi), world: uint32(m.World()), ring: uint32(ring), slab: uint32(slab), nonce: got.nonce}); err != nil {
			return nil, fail(ErrProtocol, "the pair segment", err)
		}
	}
	path := filepath.Join(t.opts.Dir, rankSegName(job, gen, j, got.nonce))
	if peerSeg, err = openMatching(path, rankSegmentSize(slab), segHeader{kind: segKindRank, job: job, gen: gen,
		a: uint32(j), world: uint32(m.World()), ring: uint32(ring), slab: uint32(slab), nonce: got.nonce}); err != nil {
		return nil, fail(ErrProtocol, "the peer's segment", err)
	}
	// Both sides have mapped everything they need once each has heard the
	// other's confirmation.
	if _, err := c.Write([]byte{1}); err != nil {
		return nil, fail(ErrPeerLost, "confirming", err)
	}
	if _, err := io.ReadFull(c, buf[:1]); err != nil || buf[0] != 1 {
		return nil, fail(ErrPeerLost, "the peer did not confirm", err)
	}
	c.SetDeadline(time.Time{})
	sc := newShmConn(j, pair, peerSeg, node, c)
	sc.spin, sc.yield = ringWait(t.opts.Spin, t.opts.Yield)
	sc.optSpin, sc.optYield, sc.small = t.opts.Spin, t.opts.Yield, t.opts.SmallBytes
	sc.local = shmAddr(fmt.Sprintf("shm:rank %d", m.Rank))
	sc.remote = shmAddr(fmt.Sprintf("shm:rank %d (%s)", j, c.RemoteAddr()))
	up := ringAt(pair, shmPage, 2*shmPage, ring)                     // lo → hi
	down := ringAt(pair, shmPage+ringCtrlSize, 2*shmPage+ring, ring) // hi → lo
	if m.Rank == lo {
		sc.tx, sc.rx = up, down
	} else {
		sc.tx, sc.rx = down, up
	}
	node.refs.Add(1)
	go sc.watch()
	return sc, nil
}

// openMatching maps a segment and checks its header against want.
func openMatching(path string, size int, want segHeader) ([]byte, error) {
	mem, err := openSegment(path, size)
	if err != nil {
		return nil, err
	}
	h, err := decodeSegHeader(mem, segMagic)
	if err == nil {
		err = h.expect(want)
	}
	if err != nil {
		unmap(mem)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return mem, nil
}
