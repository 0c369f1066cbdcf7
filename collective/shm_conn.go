package collective

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// shmRing is one direction of a pair segment: a single-producer,
// single-consumer byte ring. head and tail count bytes ever written and read;
// the producer owns head, the consumer tail.
type shmRing struct {
	head, tail             *atomic.Uint64
	consWaiting            *atomic.Uint32 // the consumer sleeps until head moves
	prodWaiting            *atomic.Uint32 // the producer sleeps until tail moves
	prodClosed, consClosed *atomic.Uint32
	data                   []byte
	size                   uint64
}

func ringAt(mem []byte, ctrl, data, size int) shmRing {
	return shmRing{
		head:        u64At(mem, ctrl+ringHead),
		tail:        u64At(mem, ctrl+ringTail),
		consWaiting: u32At(mem, ctrl+ringConsWaiting),
		prodWaiting: u32At(mem, ctrl+ringProdWaiting),
		prodClosed:  u32At(mem, ctrl+ringProdClosed),
		consClosed:  u32At(mem, ctrl+ringConsClosed),
		data:        mem[data : data+size : data+size],
		size:        uint64(size),
	}
}

// Wake-up bytes sent over the pair's TCP connection.
const (
	wakeData  = 'd' // the ring you read has bytes (or ended)
	wakeSpace = 's' // the ring you write has room (or its reader left)
)

// shmConn is a net.Conn over a pair segment: it writes into one ring and
// reads from the other. The TCP connection the pair was upgraded from stays
// open as the pair's doorbell and liveness signal. A side about to sleep
// raises its waiting word and parks its goroutine on a channel; the other
// side, seeing the word, sends one wake-up byte, which this side's watcher
// turns into a channel send. The waiter raises its word before it looks at
// the ring a last time, and the other side moves the ring before it looks at
// the word, both with fenced stores (publish32), so at least one of them sees
// the other: no wake-up is lost and nothing polls on a timer. Sleeping in
// Go's network poller rather than in a futex keeps the Go scheduler free: a
// goroutine blocked in a futex syscall holds its P, and with one or two Ps
// per rank every other goroutine of the rank would wait for the runtime to
// take it back (up to 10 ms). The
// kernel closes the socket when the peer's process dies, which ends every
// wait here (ErrPeerLost upstream); a stopped peer keeps it open (ErrTimeout
// upstream).
type shmConn struct {
	peer  int
	spin  int // the byte rings' waits (ringWait)
	yield int
	// optSpin and optYield are ShmOptions.Spin and Yield as given, for the
	// fast path's waits (shmWait).
	optSpin, optYield int
	small             int    // the fast path's ShmOptions.SmallBytes
	pair              []byte // the pair segment
	peerSeg           []byte // the peer's rank segment, for the allreduce fast path
	node              *shmNode
	tx, rx            shmRing
	tcp               net.Conn
	local             shmAddr
	remote            shmAddr

	dataCh, spaceCh chan struct{} // one pending wake-up each
	rdPoke, wrPoke  chan struct{} // a deadline changed
	gone            chan struct{} // closed by the watcher: the peer's side is gone
	closing         chan struct{} // closed by Close
	watching        chan struct{} // closed when the watcher returns
	rdTimer         *time.Timer
	wrTimer         *time.Timer

	rdDeadline, wrDeadline atomic.Int64 // unix nanoseconds, 0 for none
	peerGone               atomic.Bool
	closed                 atomic.Bool
	parks                  atomic.Uint64 // sleeps in park, which a test counts to tell parking from spinning
	wrClosed               atomic.Bool
	wakeMu                 sync.Mutex // guards wakeBuf and orders wake-up writes
	wakeBuf                [1]byte
	rdMu, wrMu             sync.Mutex // held by a Read or Write in progress; Close takes both before unmapping
	closeOnce              sync.Once
}

func newShmConn(peer int, pair, peerSeg []byte, node *shmNode, tcp net.Conn) *shmConn {
	c := &shmConn{
		peer:     peer,
		pair:     pair,
		peerSeg:  peerSeg,
		node:     node,
		tcp:      tcp,
		dataCh:   make(chan struct{}, 1),
		spaceCh:  make(chan struct{}, 1),
		rdPoke:   make(chan struct{}, 1),
		wrPoke:   make(chan struct{}, 1),
		gone:     make(chan struct{}),
		closing:  make(chan struct{}),
		watching: make(chan struct{}),
		rdTimer:  time.NewTimer(time.Hour),
		wrTimer:  time.NewTimer(time.Hour),
	}
	c.rdTimer.Stop()
	c.wrTimer.Stop()
	return c
}

type shmAddr string

func (a shmAddr) Network() string { return "shm" }
func (a shmAddr) String() string  { return string(a) }

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// watch reads the peer's wake-up bytes until the connection ends.
func (c *shmConn) watch() {
	defer close(c.watching)
	var buf [64]byte
	for {
		n, err := c.tcp.Read(buf[:])
		for _, b := range buf[:n] {
			switch b {
			case wakeData:
				poke(c.dataCh)
			case wakeSpace:
				poke(c.spaceCh)
			}
		}
		if err != nil {
			c.peerGone.Store(true)
			close(c.gone)
			return
		}
	}
}

// wake sends the peer one wake-up byte if its waiting word w says it sleeps.
func (c *shmConn) wake(w *atomic.Uint32, b byte) {
	if w.Load() != 0 && w.CompareAndSwap(1, 0) {
		c.wakeMu.Lock()
		c.wakeBuf[0] = b
		c.tcp.Write(c.wakeBuf[:])
		c.wakeMu.Unlock()
	}
}

func deadlineOf(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Read implements net.Conn.
func (c *shmConn) Read(p []byte) (int, error) {
	c.rdMu.Lock()
	defer c.rdMu.Unlock()
	if len(p) == 0 {
		return 0, nil
	}
	r := &c.rx
	tail := r.tail.Load()
	for spun := 0; ; spun++ {
		if c.closed.Load() {
			return 0, net.ErrClosed
		}
		// Flags first, then data: bytes written before the peer closed are
		// still delivered.
		ended := r.prodClosed.Load() != 0 || c.peerGone.Load()
		if head := r.head.Load(); head != tail {
			n := copyOut(p, r.data, tail, head, r.size)
			publish64(r.tail, tail+uint64(n))
			c.wake(r.prodWaiting, wakeSpace)
			return n, nil
		}
		if ended {
			return 0, io.EOF
		}
		dl := deadlineOf(c.rdDeadline.Load())
		if !dl.IsZero() && !time.Now().Before(dl) {
			return 0, os.ErrDeadlineExceeded
		}
		switch {
		case spun < c.spin:
		case spun < c.spin+c.yield:
			schedYield()
		default:
			publish32(r.consWaiting, 1)
			if r.head.Load() == tail && r.prodClosed.Load() == 0 {
				c.park(c.dataCh, c.rdPoke, c.rdTimer, dl)
			}
			r.consWaiting.Store(0)
		}
	}
}

// park waits for a wake-up, a deadline change, the deadline, the peer's end
// or Close. Nothing else wakes it: a parked side costs no CPU at all.
func (c *shmConn) park(ch, pokeCh chan struct{}, t *time.Timer, dl time.Time) {
	c.parks.Add(1)
	var expired <-chan time.Time
	if !dl.IsZero() {
		t.Reset(time.Until(dl))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-ch:
	case <-pokeCh:
	case <-expired:
	case <-c.gone:
	case <-c.closing:
	}
}

// Write implements net.Conn.
func (c *shmConn) Write(p []byte) (int, error) {
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	r := &c.tx
	head := r.head.Load()
	done := 0
	for spun := 0; done < len(p); {
		switch {
		case c.closed.Load() || c.wrClosed.Load():
			return done, net.ErrClosed
		case c.peerGone.Load() || r.consClosed.Load() != 0:
			return done, io.ErrClosedPipe
		}
		free := r.size - (head - r.tail.Load())
		if free == 0 {
			dl := deadlineOf(c.wrDeadline.Load())
			if !dl.IsZero() && !time.Now().Before(dl) {
				return done, os.ErrDeadlineExceeded
			}
			switch {
			case spun < c.spin:
			case spun < c.spin+c.yield:
				schedYield()
			default:
				publish32(r.prodWaiting, 1)
				if r.tail.Load()+r.size == head && r.consClosed.Load() == 0 {
					c.park(c.spaceCh, c.wrPoke, c.wrTimer, dl)
				}
				r.prodWaiting.Store(0)
			}
			spun++
			continue
		}
		spun = 0
		n := copyIn(r.data, p[done:], head, free, r.size)
		head += uint64(n)
		done += n
		publish64(r.head, head)
		c.wake(r.consWaiting, wakeData)
	}
	return done, nil
}

// copyOut copies ring bytes [tail, head) into p, as many as fit.
func copyOut(p, data []byte, tail, head, size uint64) int {
	n := min(uint64(len(p)), head-tail)
	off := tail % size
	k := copy(p[:n], data[off:min(off+n, size)])
	if uint64(k) < n {
		copy(p[k:n], data[:n-uint64(k)])
	}
	return int(n)
}

// copyIn copies as much of p as fits in free bytes into the ring at head.
func copyIn(data, p []byte, head, free, size uint64) int {
	n := min(uint64(len(p)), free)
	off := head % size
	k := copy(data[off:min(off+n, size)], p[:n])
	if uint64(k) < n {
		copy(data[:n-uint64(k)], p[k:n])
	}
	return int(n)
}

// CloseWrite tells the peer no more bytes will come: its reads return io.EOF
// once the ring is drained.
func (c *shmConn) CloseWrite() error {
	c.wrClosed.Store(true)
	publish32(c.tx.prodClosed, 1)
	c.wake(c.tx.consWaiting, wakeData)
	return nil
}

// Close implements net.Conn: it ends both directions, wakes every waiter,
// closes the TCP connection (the peer sees its end) and, once no Read or
// Write is in progress, unmaps the segments.
func (c *shmConn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.wrClosed.Store(true)
		publish32(c.tx.prodClosed, 1)
		publish32(c.rx.consClosed, 1)
		close(c.closing)
		c.tcp.Close()
		<-c.watching
		c.rdMu.Lock()
		c.wrMu.Lock()
		unmap(c.pair)
		unmap(c.peerSeg)
		c.pair, c.peerSeg = nil, nil
		c.node.release()
		c.wrMu.Unlock()
		c.rdMu.Unlock()
	})
	return nil
}

// LocalAddr implements net.Conn.
func (c *shmConn) LocalAddr() net.Addr { return c.local }

// RemoteAddr implements net.Conn.
func (c *shmConn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline implements net.Conn.
func (c *shmConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline implements net.Conn; a waiting Read re-reads it at once.
func (c *shmConn) SetReadDeadline(t time.Time) error {
	c.rdDeadline.Store(nanosOf(t))
	poke(c.rdPoke)
	return nil
}

// SetWriteDeadline implements net.Conn; a waiting Write re-reads it at once.
func (c *shmConn) SetWriteDeadline(t time.Time) error {
	c.wrDeadline.Store(nanosOf(t))
	poke(c.wrPoke)
	return nil
}

func nanosOf(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixNano(), 1)
}

// shmNode is this rank's own segment, shared by the connections of one
// Connect and unmapped when the last of them closes.
type shmNode struct {
	mem  []byte
	refs atomic.Int32
}

func (n *shmNode) release() {
	if n != nil && n.refs.Add(-1) == 0 {
		unmap(n.mem)
	}
}
