package collective

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// pipeCapacity is the bytes one direction of an in-process connection holds
// before writes block, like a socket buffer.
const pipeCapacity = 1 << 20

// pipeBuf is one direction of an in-process connection: a bounded byte queue
// whose reads and writes block like a socket's, with deadlines and half-close.
type pipeBuf struct {
	mu       sync.Mutex
	data     []byte // ring storage
	head, n  int
	wclosed  bool          // writer half-closed: EOF after the data
	rclosed  bool          // reader gone: writes fail
	readable chan struct{} // signalled when data arrives or the writer closes
	writable chan struct{} // signalled when space frees or the reader closes
}

func newPipeBuf() *pipeBuf {
	return &pipeBuf{data: make([]byte, pipeCapacity), readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// deadline is a settable deadline whose expiry is a closed channel.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{}
	gen   uint64 // bumped by every set, so a timer of an older deadline that fires late does nothing
}

func newDeadline() *deadline { return &deadline{ch: make(chan struct{})} }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
	}
	select {
	case <-d.ch:
		d.ch = make(chan struct{})
	default:
	}
	d.gen++
	if t.IsZero() {
		return
	}
	if dur := time.Until(t); dur <= 0 {
		close(d.ch)
	} else {
		gen := d.gen
		d.timer = time.AfterFunc(dur, func() { d.expire(gen) })
	}
}

func (d *deadline) expire(gen uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gen != gen {
		return
	}
	select {
	case <-d.ch:
	default:
		close(d.ch)
	}
}

func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

type pipeConn struct {
	in, out     *pipeBuf
	rdl, wdl    *deadline
	closeOnce   sync.Once
	local, peer pipeAddr
}

type pipeAddr string

func (a pipeAddr) Network() string { return "inproc" }
func (a pipeAddr) String() string  { return string(a) }

// bufferedPipe returns the two ends of an in-process full-duplex connection.
func bufferedPipe(a, b string) (net.Conn, net.Conn) {
	ab, ba := newPipeBuf(), newPipeBuf()
	return &pipeConn{in: ba, out: ab, rdl: newDeadline(), wdl: newDeadline(), local: pipeAddr(a), peer: pipeAddr(b)},
		&pipeConn{in: ab, out: ba, rdl: newDeadline(), wdl: newDeadline(), local: pipeAddr(b), peer: pipeAddr(a)}
}

func (c *pipeConn) Read(p []byte) (int, error) {
	q := c.in
	for {
		q.mu.Lock()
		if q.rclosed {
			q.mu.Unlock()
			return 0, net.ErrClosed
		}
		if q.n > 0 {
			k := 0
			for k < len(p) && q.n > 0 {
				end := min(q.head+q.n, len(q.data))
				m := copy(p[k:], q.data[q.head:end])
				k += m
				q.head = (q.head + m) % len(q.data)
				q.n -= m
			}
			q.mu.Unlock()
			signal(q.writable)
			return k, nil
		}
		if q.wclosed {
			q.mu.Unlock()
			return 0, io.EOF
		}
		q.mu.Unlock()
		select {
		case <-q.readable:
		case <-c.rdl.wait():
			return 0, os.ErrDeadlineExceeded
		}
	}
}

func (c *pipeConn) Write(p []byte) (int, error) {
	q := c.out
	written := 0
	for written < len(p) {
		q.mu.Lock()
		if q.rclosed || q.wclosed {
			q.mu.Unlock()
			return written, net.ErrClosed
		}
		if free := len(q.data) - q.n; free > 0 {
			for free > 0 && written < len(p) {
				tail := (q.head + q.n) % len(q.data)
				end := len(q.data)
				if tail < q.head {
					end = q.head
				}
				m := copy(q.data[tail:end], p[written:])
				written += m
				q.n += m
				free -= m
			}
			q.mu.Unlock()
			signal(q.readable)
			continue
		}
		q.mu.Unlock()
		select {
		case <-q.writable:
		case <-c.wdl.wait():
			return written, os.ErrDeadlineExceeded
		}
	}
	return written, nil
}

// CloseWrite half-closes: the peer reads what was written, then EOF.
func (c *pipeConn) CloseWrite() error {
	c.out.mu.Lock()
	c.out.wclosed = true
	c.out.mu.Unlock()
	signal(c.out.readable)
	return nil
}

func (c *pipeConn) Close() error {
	c.closeOnce.Do(func() {
		c.CloseWrite()
		c.in.mu.Lock()
		c.in.rclosed = true
		c.in.mu.Unlock()
		signal(c.in.writable)
		signal(c.in.readable)
	})
	return nil
}

func (c *pipeConn) LocalAddr() net.Addr  { return c.local }
func (c *pipeConn) RemoteAddr() net.Addr { return c.peer }
func (c *pipeConn) SetDeadline(t time.Time) error {
	c.rdl.set(t)
	c.wdl.set(t)
	return nil
}
func (c *pipeConn) SetReadDeadline(t time.Time) error  { c.rdl.set(t); return nil }
func (c *pipeConn) SetWriteDeadline(t time.Time) error { c.wdl.set(t); return nil }
