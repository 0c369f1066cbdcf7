package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Options tune a Group. Zero values take the defaults.
type Options struct {
	// Timeout bounds each operation (default 30s). A context deadline that comes
	// sooner wins.
	Timeout time.Duration
	// Heartbeat is how often an idle link proves its peer alive (default
	// Timeout/10, clamped to [20ms, 1s]). A peer silent for three heartbeats
	// when an operation times out is the one named in ErrTimeout.
	Heartbeat time.Duration
	// SegmentBytes is the unit in which large tensors are pipelined through the
	// ring (default 1 MiB).
	SegmentBytes int
	// Algorithm is the allreduce algorithm AllReduce asks for (default
	// AlgoAuto); the group's connections may replace it (see the package
	// documentation).
	Algorithm Algorithm
	// SmallBytes is AlgoAuto's threshold: messages up to this size use
	// recursive doubling, larger ones the ring or what replaces it (default
	// 64 KiB).
	SmallBytes int
	// CloseGrace bounds how long Close waits for peers to close their ends, so
	// no data in flight is reset (default 2s).
	CloseGrace time.Duration
	Logger     *zap.Logger
	// Recent is how many of its last operations the group's hang recorder
	// keeps (Group.Recent; default 64).
	Recent int
	// Observer, when set, is told of every operation's end.
	Observer Observer
}

func (o *Options) setDefaults() {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = min(max(o.Timeout/10, 20*time.Millisecond), time.Second)
	}
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = 1 << 20
	}
	o.SegmentBytes = max(o.SegmentBytes, 64) &^ 7 // whole elements of every dtype
	if o.SmallBytes <= 0 {
		o.SmallBytes = 64 << 10
	}
	if o.Recent <= 0 {
		o.Recent = 64
	}
	if o.CloseGrace <= 0 {
		o.CloseGrace = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
}

// abortGrace is how long a failing rank keeps trying to finish a frame in
// flight and to tell its peers why it failed.
const abortGrace = 250 * time.Millisecond

// maxQueued bounds the sends or receives one operation keeps in flight on one
// link. Segment sizes are raised so an operation never needs more, which is what
// keeps a ring from deadlocking on full queues.
const maxQueued = 4096

// Group is one generation of a job's ranks, fully connected. Operations run
// one at a time, in the same order on every rank; a Group is safe for use by
// several goroutines, which it serialises.
type Group struct {
	m     Membership
	rank  int
	world int
	job   uint64
	opts  Options
	log   *zap.Logger
	links []*link

	mu      sync.Mutex    // held for the whole of an operation
	seq     uint64        // collective operations started
	cur     header        // template of the running operation's data frames
	curSeq  atomic.Uint64 // cur.seq, for the link goroutines' error reports
	timer   *time.Timer
	ctx     context.Context
	ctxDone <-chan struct{}
	scratch [2][]byte
	work    []byte
	ords    []int // ring: ordinal of each step's first send

	fast     *shmFast      // the single-copy allreduce, when every peer is on shared memory
	hier     *hierarchy    // the hierarchical allreduce, when the group spans hosts of several ranks each
	plane    string        // DataPlane's text, fixed when the group is built
	lastAlgo atomic.Uint32 // the Algorithm the latest AllReduce ran
	deadline time.Time     // the running operation's
	rec      *recorder     // the hang recorder
	recSlot  int           // the running operation's entry in rec
	opBytes  int           // the running operation's buffer
	opStart  time.Time
	lastRec  OpRecord // the last operation's record, for the Observer
	// The fast path's watch of an operation's context (watchContext) stays
	// registered while operations keep passing the same context, as a
	// training loop does: registering one per operation allocated.
	watched context.Context
	stopCtx func()

	failMu  sync.Mutex
	err     error
	dead    chan struct{} // closed by fail
	closing chan struct{} // closed by Close
	closed  bool
	sendWG  sync.WaitGroup
	recvWG  sync.WaitGroup
}

// Join connects to every peer of m through t and returns the group.
func Join(ctx context.Context, t Transport, m Membership, opts Options) (*Group, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	conns, err := t.Connect(ctx, m)
	if err != nil {
		return nil, err
	}
	return newGroup(conns, m, opts), nil
}

func newGroup(conns []net.Conn, m Membership, opts Options) *Group {
	opts.setDefaults()
	g := &Group{
		m:       m,
		rank:    m.Rank,
		world:   m.World(),
		job:     JobHash(m.Job),
		opts:    opts,
		log:     opts.Logger.With(zap.String("job", m.Job), zap.Uint64("generation", m.Generation), zap.Int("rank", m.Rank)),
		links:   make([]*link, m.World()),
		timer:   time.NewTimer(time.Hour),
		dead:    make(chan struct{}),
		closing: make(chan struct{}),
		rec:     newRecorder(opts.Recent),
	}
	g.timer.Stop()
	g.fast = newShmFast(g, conns)
	if g.fast == nil {
		g.hier = newHierarchy(m, conns)
	}
	for j, c := range conns {
		if c != nil {
			g.links[j] = newLink(g, j, c)
		}
	}
	g.plane = g.describePlane()
	for _, l := range g.links {
		if l != nil {
			g.sendWG.Add(1)
			g.recvWG.Add(1)
			go l.sendLoop()
			go l.recvLoop()
		}
	}
	return g
}

// Rank is this rank's index in the group.
func (g *Group) Rank() int { return g.rank }

// Size is the number of ranks.
func (g *Group) Size() int { return g.world }

// DataPlane says how this rank reaches its peers: "local" (a world of
// one), "shm" (every peer through shared memory), "tcp" (every peer over
// TCP), "hierarchical" (shared memory inside each host, TCP across hosts) or
// "shm+tcp" (a mixed group running the flat algorithms over both); then,
// but for "local", in parentheses, the allreduce algorithms the group
// chooses when the caller leaves the choice to it, by dtype and size, e.g.
// "tcp (allreduce: rd up to 64 KiB, ring above)" or "shm (allreduce: float32
// and float64 single-copy; other dtypes rd up to 64 KiB, ring above)". The
// first word is the plane; LastAlgorithm says what an allreduce ran.
func (g *Group) DataPlane() string { return g.plane }

func (g *Group) describePlane() string {
	plane := g.linkPlane()
	if g.world == 1 {
		return plane
	}
	return plane + " (allreduce: " + allreducePlan(g.allreducePaths(), g.opts) + ")"
}

// linkPlane is DataPlane's first word.
func (g *Group) linkPlane() string {
	switch {
	case g.world == 1:
		return "local"
	case g.fast != nil:
		return "shm"
	case g.hier != nil:
		return "hierarchical"
	}
	shm, tcp := false, false
	for _, l := range g.links {
		if l == nil {
			continue
		}
		if _, ok := l.conn.(*shmConn); ok {
			shm = true
		} else {
			tcp = true
		}
	}
	switch {
	case shm && tcp:
		return "shm+tcp"
	case shm:
		return "shm"
	}
	return "tcp"
}

// Generation is the group's generation.
func (g *Group) Generation() uint64 { return g.m.Generation }

// Membership returns the membership the group was built from.
func (g *Group) Membership() Membership { return g.m }

// Err returns the error that broke the group, or nil while it is usable.
func (g *Group) Err() error {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	return g.err
}

// Failed is closed when the group breaks (a peer lost, a protocol error, an
// abort, Close); Err then says why. It lets a caller that waits on something
// else — a control-plane message — notice a dead peer between operations.
func (g *Group) Failed() <-chan struct{} { return g.dead }

// Abort fails the running operation (if any) and the group on this rank, and
// tells the peers, whose operations fail with ErrAborted.
func (g *Group) Abort(reason string) {
	g.fail(&OpError{Op: "abort", Rank: -1, ReportedBy: g.rank, Kind: ErrAborted, Detail: reason})
}

// fail records the first failure, wakes every wait, and unblocks the link
// goroutines: reads at once, writes after a short grace so that a frame in
// flight can finish and the peers can be told why.
func (g *Group) fail(err error) error {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	if g.err != nil {
		return g.err
	}
	g.err = err
	close(g.dead)
	if g.fast != nil {
		g.fast.interrupt()
	}
	now := time.Now()
	for _, l := range g.links {
		if l != nil {
			l.conn.SetReadDeadline(now)
			l.conn.SetWriteDeadline(now.Add(abortGrace))
		}
	}
	if !g.closed {
		g.log.Warn("collective group failed", zap.Error(err))
	}
	return err
}

// Close shuts the group down. On a healthy group it says goodbye to every peer
// and waits (up to CloseGrace) for them to close too, so nothing in flight is
// reset; on a failed one it just closes the connections. A running operation
// fails with ErrClosed.
func (g *Group) Close() error {
	g.failMu.Lock()
	if g.closed {
		g.failMu.Unlock()
		return nil
	}
	g.closed = true
	g.failMu.Unlock()
	if !g.mu.TryLock() {
		g.fail(&OpError{Op: "close", Rank: -1, ReportedBy: g.rank, Kind: ErrClosed})
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	g.unwatch()
	healthy := g.failure() == nil
	close(g.closing)
	g.sendWG.Wait() // healthy senders have written their goodbye and half-closed
	if healthy {
		deadline := time.Now().Add(g.opts.CloseGrace)
		for _, l := range g.links {
			if l != nil {
				l.conn.SetReadDeadline(deadline)
			}
		}
	}
	g.recvWG.Wait()
	g.fail(&OpError{Op: "close", Rank: -1, ReportedBy: g.rank, Kind: ErrClosed})
	for _, l := range g.links {
		if l != nil {
			l.conn.Close()
		}
	}
	return nil
}

func (g *Group) failure() error {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	return g.err
}

// begin starts an operation: takes the group, numbers it, arms its deadline.
// Every successful begin is paired with end.
func (g *Group) begin(ctx context.Context, op opCode, dt DType, count int, arg uint32) error {
	g.mu.Lock()
	if err := g.failure(); err != nil {
		g.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		// Skipping an operation the peers will run desynchronises the group.
		err = g.fail(&OpError{Op: op.String(), Rank: -1, ReportedBy: g.rank, Kind: ErrAborted, Err: err})
		g.mu.Unlock()
		return err
	}
	if op != opSendRecv {
		g.seq++
	}
	g.cur = header{kind: kindData, op: op, dtype: dt, src: uint32(g.rank), gen: g.m.Generation,
		seq: g.seq, job: g.job, count: uint64(count), arg: arg}
	g.curSeq.Store(g.seq)
	g.opStart = time.Now()
	g.opBytes = count * dt.Size()
	g.recSlot = g.rec.enter(OpRecord{Op: op.String(), Group: g.m.Job, Seq: g.seq, Generation: g.m.Generation, Rank: g.rank, World: g.world,
		Bytes: g.opBytes, Plane: planeWord(g.plane), Start: g.opStart})
	g.ctx, g.ctxDone = ctx, ctx.Done()
	timeout := g.opts.Timeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	g.timer.Reset(timeout)
	g.deadline = time.Now().Add(timeout)
	if g.fast != nil && ctx != g.watched {
		g.unwatch()
		g.watched, g.stopCtx = ctx, g.fast.watchContext(ctx)
	}
	for _, l := range g.links {
		if l != nil {
			l.sendIdx, l.recvIdx = 0, 0
		}
	}
	return nil
}

// end finishes an operation: on success waits for every queued frame; on
// failure fails the group and waits for its link goroutines to stop, so no
// goroutine touches the caller's memory after the operation returns.
func (g *Group) end(err error) error {
	if err == nil {
		err = g.drain()
	}
	g.timer.Stop()
	if err != nil {
		g.fail(err)
		g.sendWG.Wait()
		g.recvWG.Wait()
		err = g.failure()
	}
	g.ctx, g.ctxDone = nil, nil
	algo := ""
	if g.cur.op == opAllReduce {
		algo = Algorithm(g.lastAlgo.Load()).String()
	}
	g.rec.end(g.recSlot, algo, time.Now(), err, &g.lastRec)
	if g.opts.Observer != nil {
		g.opts.Observer.OpEnded(&g.lastRec)
	}
	g.mu.Unlock()
	return err
}

// planeWord is a DataPlane text's first word: the plane itself.
func planeWord(s string) string {
	for i := range len(s) {
		if s[i] == ' ' {
			return s[:i]
		}
	}
	return s
}

// unwatch ends the fast path's watch of the last operation's context. A
// watch left registered between operations only rings this rank's own
// doorbell if that context ends, which a waiter treats as a reason to look
// again, never as an event.
func (g *Group) unwatch() {
	if g.stopCtx != nil {
		g.stopCtx()
	}
	g.watched, g.stopCtx = nil, nil
}

func (g *Group) drain() error {
	for _, l := range g.links {
		if l == nil {
			continue
		}
		for l.pendRecv > 0 {
			if err := g.waitRecv(l); err != nil {
				return err
			}
		}
		for l.pendSend > 0 {
			if err := g.waitSent(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// send queues p to peer l as the next data frame of the running operation.
func (g *Group) send(l *link, p []byte) error {
	h := g.cur
	h.index = l.sendIdx
	h.length = uint32(len(p))
	if g.cur.op == opSendRecv {
		h.seq = l.p2pSendSeq
	}
	l.sendIdx++
	select {
	case l.sendq <- sendReq{h: h, p: p}:
		l.pendSend++
		return nil
	case <-g.dead:
		return g.failure()
	case <-g.timer.C:
		return g.timedOut(l.peer)
	case <-g.ctxDone:
		return g.cancelled()
	}
}

// recv queues p to be filled by the next data frame from peer l.
func (g *Group) recv(l *link, p []byte) error {
	h := g.cur
	h.src = uint32(l.peer)
	h.index = l.recvIdx
	h.length = uint32(len(p))
	if g.cur.op == opSendRecv {
		h.seq = l.p2pRecvSeq
	}
	l.recvIdx++
	select {
	case l.recvq <- recvReq{h: h, p: p}:
		l.pendRecv++
		return nil
	case <-g.dead:
		return g.failure()
	case <-g.timer.C:
		return g.timedOut(l.peer)
	case <-g.ctxDone:
		return g.cancelled()
	}
}

// waitSent waits for the oldest queued send to l to be written.
func (g *Group) waitSent(l *link) error {
	select {
	case err := <-l.sent:
		l.pendSend--
		return err
	case <-g.dead:
		return g.failure()
	case <-g.timer.C:
		return g.timedOut(l.peer)
	case <-g.ctxDone:
		return g.cancelled()
	}
}

// waitRecv waits for the oldest queued receive from l to be filled.
func (g *Group) waitRecv(l *link) error {
	select {
	case err := <-l.recvd:
		l.pendRecv--
		return err
	case <-g.dead:
		return g.failure()
	case <-g.timer.C:
		return g.timedOut(l.peer)
	case <-g.ctxDone:
		return g.cancelled()
	}
}

// timedOut fails the group with ErrTimeout, naming the peer silent for longest
// if one has been silent for three heartbeats, else the one being waited on.
func (g *Group) timedOut(waitingOn int) error {
	now := time.Now().UnixNano()
	blamed, silence := waitingOn, int64(0)
	for _, l := range g.links {
		if l == nil || l.parked.Load() {
			continue // a parked frame proves the peer is ahead of us, not silent
		}
		if age := now - l.lastHeard.Load(); age > silence {
			blamed, silence = l.peer, age
		}
	}
	if silence < int64(3*g.opts.Heartbeat) && waitingOn >= 0 && g.links[waitingOn] != nil {
		blamed = waitingOn
		silence = now - g.links[waitingOn].lastHeard.Load()
	}
	var cause error
	if g.ctx != nil && g.ctx.Err() != nil {
		cause = g.ctx.Err()
	}
	return g.fail(&OpError{Op: g.cur.op.String(), Seq: g.cur.seq, Rank: blamed, ReportedBy: g.rank, Kind: ErrTimeout,
		Detail: fmt.Sprintf("no bytes from rank %d for %v", blamed, time.Duration(silence).Round(time.Millisecond)), Err: cause})
}

func (g *Group) cancelled() error {
	err := g.ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return g.timedOut(g.blameDefault())
	}
	return g.fail(&OpError{Op: g.cur.op.String(), Seq: g.cur.seq, Rank: -1, ReportedBy: g.rank, Kind: ErrAborted, Err: err})
}

func (g *Group) blameDefault() int {
	for _, l := range g.links {
		if l != nil {
			return l.peer
		}
	}
	return -1
}

// scratchBuf returns reusable scratch space i of at least n bytes.
func (g *Group) scratchBuf(i, n int) []byte {
	if cap(g.scratch[i]) < n {
		g.scratch[i] = make([]byte, n)
	}
	return g.scratch[i][:n]
}

func (g *Group) workBuf(n int) []byte {
	if cap(g.work) < n {
		g.work = make([]byte, n)
	}
	return g.work[:n]
}
