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
	dataSeq, consWaiting   *atomic.Uint32
	spaceSeq, prodWaiting  *atomic.Uint32
	prodClosed, consClosed *atomic.Uint32
	data                   []byte
	size                   uint64
}

func ringAt(mem []byte, ctrl, data, size int) shmRing {
	return shmRing{
		head:        u64At(mem, ctrl+ringHead),
		tail:        u64At(mem, ctrl+ringTail),
		dataSeq:     u32At(mem, ctrl+ringDataSeq),
		consWaiting: u32At(mem, ctrl+ringConsWaiting),
		spaceSeq:    u32At(mem, ctrl+ringSpaceSeq),
		prodWaiting: u32At(mem, ctrl+ringProdWaiting),
		prodClosed:  u32At(mem, ctrl+ringProdClosed),
		consClosed:  u32At(mem, ctrl+ringConsClosed),
		data:        mem[data : data+size : data+size],
		size:        uint64(size),
	}
}

func (r *shmRing) dataBell() bell  { return bell{seq: r.dataSeq, waiting: r.consWaiting} }
func (r *shmRing) spaceBell() bell { return bell{seq: r.spaceSeq, waiting: r.prodWaiting} }

// shmConn is a net.Conn over a pair segment: it writes into one ring and
// reads from the other. The TCP connection the pair was upgraded from stays
// open, silent, as the liveness signal: the kernel closes it when the peer's
// process dies, which wakes every waiter here (ErrPeerLost upstream), while a
// stopped peer keeps it open (ErrTimeout upstream).
type shmConn struct {
	peer     int
	spin     int
	small    int    // the fast path's ShmOptions.SmallBytes
	pair     []byte // the pair segment
	peerSeg  []byte // the peer's rank segment, for the allreduce fast path
	node     *shmNode
	tx, rx   shmRing
	tcp      net.Conn
	local    shmAddr
	remote   shmAddr
	watching chan struct{} // closed when the liveness watcher returns

	rdDeadline, wrDeadline atomic.Int64 // unix nanoseconds, 0 for none
	peerGone               atomic.Bool
	closed                 atomic.Bool
	wrClosed               atomic.Bool
	rdMu, wrMu             sync.Mutex // held by a Read or Write in progress; Close takes both before unmapping
	closeOnce              sync.Once
}

type shmAddr string

func (a shmAddr) Network() string { return "shm" }
func (a shmAddr) String() string  { return string(a) }

func (c *shmConn) watch() {
	defer close(c.watching)
	var b [1]byte
	c.tcp.Read(b[:]) // returns only when the peer's process or group is gone (or we close)
	c.peerGone.Store(true)
	c.rx.dataBell().force()
	c.tx.spaceBell().force()
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
	for {
		if c.closed.Load() {
			return 0, net.ErrClosed
		}
		// Flags first, then data: bytes written before the peer closed are
		// still delivered.
		ended := r.prodClosed.Load() != 0 || c.peerGone.Load()
		if head := r.head.Load(); head != tail {
			n := copyOut(p, r.data, tail, head, r.size)
			r.tail.Store(tail + uint64(n))
			r.spaceBell().ring()
			return n, nil
		}
		if ended {
			return 0, io.EOF
		}
		dl := deadlineOf(c.rdDeadline.Load())
		if !dl.IsZero() && !time.Now().Before(dl) {
			return 0, os.ErrDeadlineExceeded
		}
		c.waitAtLeast(r.dataBell(), r.head, tail+1, &c.rdDeadline, func() bool {
			return r.prodClosed.Load() != 0
		})
	}
}

// Write implements net.Conn.
func (c *shmConn) Write(p []byte) (int, error) {
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	r := &c.tx
	head := r.head.Load()
	done := 0
	for done < len(p) {
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
			c.waitAtLeast(r.spaceBell(), r.tail, head-r.size+1, &c.wrDeadline, func() bool {
				return r.consClosed.Load() != 0
			})
			continue
		}
		n := copyIn(r.data, p[done:], head, free, r.size)
		head += uint64(n)
		done += n
		r.head.Store(head)
		r.dataBell().ring()
	}
	return done, nil
}

// waitAtLeast spins briefly, then sleeps on b until *w >= target, the
// deadline in *dl passes, the connection or its peer ends, or ended says so.
func (c *shmConn) waitAtLeast(b bell, w *atomic.Uint64, target uint64, dl *atomic.Int64, ended func() bool) {
	for range c.spin {
		if w.Load() >= target {
			return
		}
	}
	for {
		if w.Load() >= target || c.closed.Load() || c.peerGone.Load() || ended() {
			return
		}
		d := deadlineOf(dl.Load())
		if !d.IsZero() && !time.Now().Before(d) {
			return
		}
		s := b.seq.Load()
		b.waiting.Store(1)
		if w.Load() >= target || c.closed.Load() || c.peerGone.Load() || ended() {
			b.waiting.Store(0)
			return
		}
		futexWait(b.seq, s, d)
		b.waiting.Store(0)
	}
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
	c.tx.prodClosed.Store(1)
	c.tx.dataBell().force()
	return nil
}

// Close implements net.Conn: it ends both directions, wakes every waiter on
// both sides, closes the liveness connection and, once no Read or Write is in
// progress, unmaps the segments.
func (c *shmConn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.wrClosed.Store(true)
		c.tx.prodClosed.Store(1)
		c.rx.consClosed.Store(1)
		c.rx.dataBell().force()
		c.tx.spaceBell().force()
		c.tx.dataBell().force()
		c.rx.spaceBell().force()
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
	c.rx.dataBell().force()
	return nil
}

// SetWriteDeadline implements net.Conn; a waiting Write re-reads it at once.
func (c *shmConn) SetWriteDeadline(t time.Time) error {
	c.wrDeadline.Store(nanosOf(t))
	c.tx.spaceBell().force()
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
