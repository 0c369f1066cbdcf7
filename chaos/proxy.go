package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
)

// ProxyFaults are what a Proxy does to the bytes it forwards, in each
// direction of each connection. The zero value forwards them untouched.
type ProxyFaults struct {
	// Delay holds each chunk this long after it was read (latency, not a
	// rate: chunks in flight overlap).
	Delay time.Duration
	// Rate caps each direction of each connection, in bytes per second
	// (0: unlimited).
	Rate int64
	// Loss is the probability, in [0, 1], that a chunk is held LossDelay
	// longer: what a lost segment costs a TCP stream (its retransmission).
	// Nothing is lost from the stream.
	Loss      float64
	LossDelay time.Duration // default 200ms, a typical minimum retransmission timeout
	// Stall holds every byte until it is cleared: a partition, after which
	// TCP delivers what waited. Reading goes on until the proxy's buffers
	// are full, then the senders' own buffers fill.
	Stall bool
	// Drop discards every byte read while set: a black hole. The streams
	// lose those bytes for good.
	Drop bool
}

// ProxyStats count what a Proxy did.
type ProxyStats struct {
	Conns     int64 // connections accepted and dialed through
	Forwarded int64 // bytes written to the other side
	Dropped   int64 // bytes discarded (Drop)
	Lost      int64 // chunks held for a retransmission (Loss)
	Resets    int64 // connections reset (Reset)
	Refused   int64 // connections accepted but not dialed through
}

const (
	proxyChunk    = 32 << 10
	proxyInFlight = 64 // chunks buffered per direction: 2 MiB
)

// A Proxy is a fault-injecting TCP relay: every connection its listener
// accepts is dialed through to its backend and the bytes of both
// directions are copied, with the faults set (Set) applied on the way.
// The listener and the dialer may live in different network namespaces:
// a socket keeps the namespace it was made in.
type Proxy struct {
	ln   net.Listener
	dial func(context.Context) (net.Conn, error)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	faults  ProxyFaults
	from    map[netip.Addr]ProxyFaults // by client address, instead of faults
	set     chan struct{}              // closed and replaced on every Set
	changed chan struct{}              // closed and replaced on every change of the stats
	conns   map[*proxyConn]struct{}
	stats   ProxyStats
	rng     *rand.Rand
}

// proxyConn is one relayed connection: the accepted side and the dialed.
type proxyConn struct {
	client, backend net.Conn
	from            netip.Addr // the client's address
	once            sync.Once
}

// resetClose closes c with a reset, not an orderly close.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// closeBoth closes both sides; rst makes each close send a reset.
func (c *proxyConn) closeBoth(rst bool) {
	c.once.Do(func() {
		for _, s := range []net.Conn{c.client, c.backend} {
			if rst {
				resetClose(s)
				continue
			}
			s.Close()
		}
	})
}

// NewProxy relays every connection ln accepts to a connection dial makes,
// until Close; seed drives Loss's choices. The proxy owns ln.
func NewProxy(ln net.Listener, dial func(context.Context) (net.Conn, error), seed uint64) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{ln: ln, dial: dial, ctx: ctx, cancel: cancel, set: make(chan struct{}), changed: make(chan struct{}),
		conns: map[*proxyConn]struct{}{}, rng: rand.New(rand.NewPCG(seed, 0x7072))}
	p.wg.Add(1)
	go p.accept()
	return p
}

// TCPDialer dials addr over TCP: a Proxy's backend in this namespace.
func TCPDialer(addr string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Set replaces the faults applied from now on (to bytes already waiting
// too: clearing Stall releases them) to connections from clients SetFrom
// names no faults for.
func (p *Proxy) Set(f ProxyFaults) {
	p.mu.Lock()
	p.faults = f
	p.setLocked()
	p.mu.Unlock()
}

// SetFrom replaces the faults applied to connections from clients at addr,
// instead of Set's; the zero ProxyFaults forgets addr (Set's apply again).
func (p *Proxy) SetFrom(addr netip.Addr, f ProxyFaults) {
	p.mu.Lock()
	if p.from == nil {
		p.from = map[netip.Addr]ProxyFaults{}
	}
	if f == (ProxyFaults{}) {
		delete(p.from, addr)
	} else {
		p.from[addr] = f
	}
	p.setLocked()
	p.mu.Unlock()
}

func (p *Proxy) setLocked() {
	close(p.set)
	p.set = make(chan struct{})
}

// Faults are the faults applied to connections from addr (an invalid
// netip.Addr: Set's).
func (p *Proxy) Faults(addr netip.Addr) ProxyFaults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faultsLocked(addr)
}

func (p *Proxy) faultsLocked(addr netip.Addr) ProxyFaults {
	f, ok := p.from[addr]
	if !ok {
		f = p.faults
	}
	if f.LossDelay <= 0 {
		f.LossDelay = 200 * time.Millisecond
	}
	return f
}

// Stats are the counts so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Wait blocks until cond holds of the stats (or ctx ends).
func (p *Proxy) Wait(ctx context.Context, cond func(ProxyStats) bool) error {
	for {
		p.mu.Lock()
		ok, ch := cond(p.stats), p.changed
		p.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("chaos: proxy %s: waiting for its stats: %w", p.Addr(), ctx.Err())
		}
	}
}

// Reset resets every open connection, both sides (a TCP RST to the client
// and to the backend), and returns how many there were. New connections
// are still accepted.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	cs := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.closeBoth(true)
	}
	p.count(func(s *ProxyStats) { s.Resets += int64(len(cs)) })
	return len(cs)
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.cancel()
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.closeBoth(false)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) count(f func(*ProxyStats)) {
	p.mu.Lock()
	f(&p.stats)
	p.changedLocked()
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

// relay dials the backend for client and copies both directions.
func (p *Proxy) relay(client net.Conn) {
	defer p.wg.Done()
	dctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	backend, err := p.dial(dctx)
	cancel()
	if err != nil {
		p.count(func(s *ProxyStats) { s.Refused++ }) // counted before the client sees its end
		client.Close()
		return
	}
	c := &proxyConn{client: client, backend: backend}
	if ap, err := netip.ParseAddrPort(client.RemoteAddr().String()); err == nil {
		c.from = ap.Addr().Unmap()
	}
	p.mu.Lock()
	if p.ctx.Err() != nil {
		p.mu.Unlock()
		c.closeBoth(false)
		return
	}
	p.conns[c] = struct{}{}
	p.stats.Conns++
	p.changedLocked()
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(c, client, backend) }()
	go func() { defer wg.Done(); p.pipe(c, backend, client) }()
	wg.Wait()
	c.closeBoth(false)
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// chunk is bytes read from one side, waiting to be written to the other.
type chunk struct {
	buf []byte
	n   int
	at  time.Time
	err error // the read's end (io.EOF: a half-close to pass on)
}

// pipe copies from src to dst through a bounded queue of reused buffers:
// a reader that stamps each chunk, and a writer that applies the faults.
func (p *Proxy) pipe(c *proxyConn, src, dst net.Conn) {
	free := make(chan []byte, proxyInFlight)
	for range proxyInFlight {
		free <- make([]byte, proxyChunk)
	}
	queue := make(chan chunk, proxyInFlight)
	go func() {
		defer close(queue)
		for {
			var buf []byte
			select {
			case buf = <-free:
			case <-p.ctx.Done():
				return
			}
			n, err := src.Read(buf)
			if n > 0 && p.Faults(c.from).Drop {
				p.count(func(s *ProxyStats) { s.Dropped += int64(n) })
				n = 0
			}
			if n > 0 || err != nil {
				queue <- chunk{buf: buf, n: n, at: time.Now(), err: err}
			} else {
				free <- buf
			}
			if err != nil {
				return
			}
		}
	}()
	var rateFree time.Time // when the rate lets the next chunk go
	for ch := range queue {
		if ch.n > 0 {
			if err := p.deliver(c.from, dst, ch, &rateFree); err != nil {
				c.closeBoth(false)
				break
			}
		}
		if ch.err != nil {
			if errors.Is(ch.err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					tc.CloseWrite()
					break
				}
			}
			c.closeBoth(false)
			break
		}
		free <- ch.buf
	}
	for ch := range queue { // unblock the reader (its source is closed, or the proxy)
		free <- ch.buf
	}
}

// deliver writes one chunk once the faults let it go.
func (p *Proxy) deliver(from netip.Addr, dst net.Conn, ch chunk, rateFree *time.Time) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	lossDecided, lost := false, false
	for {
		p.mu.Lock()
		f, changed := p.faultsLocked(from), p.set
		if !lossDecided && f.Loss > 0 {
			lossDecided, lost = true, p.rng.Float64() < f.Loss
			if lost {
				p.stats.Lost++
				p.changedLocked()
			}
		}
		p.mu.Unlock()
		due := ch.at.Add(f.Delay)
		if lost {
			due = due.Add(f.LossDelay)
		}
		if f.Rate > 0 && rateFree.After(due) {
			due = *rateFree
		}
		wait := time.Until(due)
		if !f.Stall && wait <= 0 {
			if f.Rate > 0 {
				*rateFree = time.Now().Add(time.Duration(int64(ch.n) * int64(time.Second) / f.Rate))
			}
			break
		}
		var tc <-chan time.Time
		if !f.Stall {
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			tc = timer.C
		}
		select {
		case <-tc:
		case <-changed:
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
	}
	if _, err := dst.Write(ch.buf[:ch.n]); err != nil {
		return err
	}
	p.count(func(s *ProxyStats) { s.Forwarded += int64(ch.n) })
	return nil
}
