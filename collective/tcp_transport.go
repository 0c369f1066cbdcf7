package collective

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/internal/netaddr"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// TCPOptions configure a TCPTransport.
type TCPOptions struct {
	// Bind is the listen address, e.g. "127.0.0.1:0" or "0.0.0.0:7070".
	Bind string
	// Advertise is the address peers dial: host:port (a proxy's, say), or a
	// host alone, which takes the bound port. Empty means the bound address;
	// a Bind of every interface (0.0.0.0, ::, or no host) needs one.
	Advertise string
	// HandshakeTimeout bounds reading a dialer's hello (default 10s).
	HandshakeTimeout time.Duration
	// Job, when set, is the only job whose hellos are admitted, with its
	// sub-groups ("Job/..."; a straggler's feed): another job's are refused
	// at once, with the reason. Without it a hello waits, parked, for a
	// Connect of its job and generation.
	Job string
	// TLS, when set, is mutual TLS on every connection of the transport:
	// Server for those peers dial in, Client for those this rank dials
	// (pki.Material's of the job). A plaintext peer is refused, and told
	// why when it speaks this protocol.
	TLS    *TLSConfigs
	Logger *zap.Logger
}

// TLSConfigs are a transport's two sides of mutual TLS.
type TLSConfigs struct{ Server, Client *tls.Config }

// maxParked bounds the connections parked for a Connect not called yet
// (an early generation's peers): beyond it hellos are refused, so a peer
// sending hellos of ever newer generations cannot exhaust descriptors.
const maxParked = 1024

// TCPTransport is the framed-TCP transport. One listener serves every
// generation of a job, so a rebuilt group reuses the same port.
type TCPTransport struct {
	ln        net.Listener
	advertise string
	hsTimeout time.Duration
	job       string
	tls       *TLSConfigs
	log       *zap.Logger

	mu         sync.Mutex
	arrivals   map[connKey]arrival
	rejects    map[connKey]error
	newest     map[string]uint64 // newest generation Connect was called for, per job
	lastReject string
	changed    chan struct{} // closed and replaced whenever arrivals or rejects change
	closed     bool
	wg         sync.WaitGroup
}

type arrival struct {
	conn  net.Conn
	hello *phalanxpb.Hello
}

// ListenTCP binds the transport's listener and starts accepting peers.
func ListenTCP(opts TCPOptions) (*TCPTransport, error) {
	if opts.Bind == "" {
		return nil, fmt.Errorf("collective: TCP transport needs a bind address")
	}
	if err := netaddr.Check(opts.Bind, opts.Advertise); err != nil {
		return nil, fmt.Errorf("collective: %w", err)
	}
	ln, err := net.Listen("tcp", opts.Bind)
	if err != nil {
		return nil, fmt.Errorf("collective: listen on %s: %w", opts.Bind, err)
	}
	plantLeakListener(ln)
	t := &TCPTransport{
		ln:        ln,
		hsTimeout: opts.HandshakeTimeout,
		job:       opts.Job,
		tls:       opts.TLS,
		log:       opts.Logger,
		arrivals:  map[connKey]arrival{},
		rejects:   map[connKey]error{},
		newest:    map[string]uint64{},
		changed:   make(chan struct{}),
	}
	t.advertise = netaddr.Advertised(opts.Advertise, ln.Addr().(*net.TCPAddr).Port)
	if t.advertise == "" {
		t.advertise = ln.Addr().String()
	}
	if t.hsTimeout <= 0 {
		t.hsTimeout = 10 * time.Second
	}
	if t.log == nil {
		t.log = zap.NewNop()
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

// Addr is the address peers should dial.
func (t *TCPTransport) Addr() string { return t.advertise }

// Close stops accepting and closes connections no group has claimed.
func (t *TCPTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	for k, a := range t.arrivals {
		a.conn.Close()
		delete(t.arrivals, k)
	}
	t.notifyLocked()
	t.mu.Unlock()
	err := t.ln.Close()
	t.wg.Wait()
	return err
}

func (t *TCPTransport) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

func (t *TCPTransport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn("data-plane accept failed", zap.Error(err))
			continue
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			t.admit(c)
		}()
	}
}

// admit reads a dialer's hello and parks the connection until the Connect call
// of its generation claims it. Garbage, other protocol versions and dead
// generations are refused here, with the reason sent back when it can be.
func (t *TCPTransport) admit(c net.Conn) {
	c.SetDeadline(time.Now().Add(t.hsTimeout))
	if t.tls != nil {
		raw := newBatchConn(c)
		tc := tls.Server(raw, t.tls.Server)
		if err := tc.Handshake(); err != nil {
			t.refuseTLS(c, err)
			return
		}
		c = &tlsConn{Conn: tc, raw: raw}
	}
	hello := &phalanxpb.Hello{}
	ver, err := readHandshake(c, hello)
	if err == nil && ver != ProtocolVersion {
		err = fmt.Errorf("peer speaks data-plane protocol version %d, this rank speaks %d", ver, ProtocolVersion)
	}
	if err == nil && hello.GetProbe() {
		t.answerProbe(c)
		return
	}
	key := connKey{hello.GetJob(), hello.GetGeneration(), int(hello.GetFromRank()), int(hello.GetToRank())}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil && t.closed {
		err = fmt.Errorf("transport closed")
	}
	if err == nil && t.job != "" && key.job != t.job && !strings.HasPrefix(key.job, t.job+"/") {
		err = fmt.Errorf("job %q is not this rank's job %q", key.job, t.job)
	}
	if err == nil && key.gen < t.newest[key.job] {
		err = fmt.Errorf("generation %d is older than the current generation %d", key.gen, t.newest[key.job])
	}
	if _, replaces := t.arrivals[key]; err == nil && !replaces && len(t.arrivals) >= maxParked {
		err = fmt.Errorf("%d connections already wait for their generation", len(t.arrivals))
	}
	if err != nil {
		reason := fmt.Sprintf("refused data-plane connection from %s: %v", c.RemoteAddr(), err)
		t.lastReject = reason
		t.notifyLocked()
		t.log.Warn("refused data-plane connection", zap.Stringer("from", c.RemoteAddr()), zap.Error(err))
		if ver != 0 {
			writeHandshake(c, &phalanxpb.HelloReply{ProtocolVersion: ProtocolVersion, Error: reason})
			if key.job != "" {
				t.rejects[key] = &OpError{Op: "connect", Rank: key.from, ReportedBy: key.to, Kind: ErrProtocol, Detail: reason}
			}
		}
		c.Close()
		return
	}
	if old, ok := t.arrivals[key]; ok {
		old.conn.Close()
	}
	t.arrivals[key] = arrival{conn: c, hello: hello}
	t.notifyLocked()
}

// refuseTLS closes a connection whose TLS handshake failed, saying why
// in the log and in the reason a waiting Connect reports. A peer that
// spoke this protocol in plaintext is told, in plaintext, that TLS is
// required.
func (t *TCPTransport) refuseTLS(c net.Conn, err error) {
	defer c.Close()
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && rh.Conn != nil && binary.LittleEndian.Uint32(rh.RecordHeader[:4]) == handshakeMagic {
		err = errors.New("a plaintext peer: this rank's data plane requires mutual TLS")
		writeHandshake(rh.Conn, &phalanxpb.HelloReply{ProtocolVersion: ProtocolVersion,
			Error: "refused: this rank's data plane requires mutual TLS (a certificate of the job's CA)"})
	}
	reason := fmt.Sprintf("refused data-plane connection from %s: %v", c.RemoteAddr(), err)
	t.mu.Lock()
	t.lastReject = reason
	t.notifyLocked()
	t.mu.Unlock()
	t.log.Warn("refused data-plane connection", zap.Stringer("from", c.RemoteAddr()), zap.Error(err))
}

// answerProbe answers a liveness probe (Probe) and closes its connection:
// ok while the transport is open.
func (t *TCPTransport) answerProbe(c net.Conn) {
	defer c.Close()
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	reply := &phalanxpb.HelloReply{ProtocolVersion: ProtocolVersion, Ok: !closed}
	if closed {
		reply.Error = "transport closed"
	}
	writeHandshake(c, reply)
}

// Probe asks the data-plane transport at addr whether it is alive, for a
// coordinator checking a reported loss: nil once the transport answered
// that it is open. A TCP connection alone proves nothing: the kernel
// completes handshakes on a listening socket whatever its process does,
// and the listener of a process being killed outlives its connections by
// several milliseconds (measured: dials succeeded up to 15ms after a
// peer's connection to that process read EOF). An answer needs the
// process's own code to run. ctx bounds the whole exchange.
// With cfg (the job's client side of mutual TLS: a TLS transport refuses
// a plaintext probe) the exchange is over TLS.
func Probe(ctx context.Context, addr string, cfg *tls.Config) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("probing %s: %w", addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if cfg != nil {
		tc := tls.Client(c, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("probing %s: TLS: %w", addr, err)
		}
		c = tc
	}
	if err := writeHandshake(c, &phalanxpb.Hello{ProtocolVersion: ProtocolVersion, Probe: true}); err != nil {
		return fmt.Errorf("probing %s: %w", addr, err)
	}
	reply := &phalanxpb.HelloReply{}
	if _, err := readHandshake(c, reply); err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("probing %s: no answer: %w", addr, err)
	}
	if !reply.GetOk() {
		return fmt.Errorf("probing %s: it answered %q", addr, reply.GetError())
	}
	return nil
}

// Connect dials every lower rank and waits for every higher rank to dial it.
func (t *TCPTransport) Connect(ctx context.Context, m Membership) ([]net.Conn, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, &OpError{Op: "connect", Rank: -1, Kind: ErrClosed, Detail: "transport closed"}
	}
	if m.Generation > t.newest[m.Job] {
		t.newest[m.Job] = m.Generation
	}
	for k, a := range t.arrivals { // connections of dead generations are never claimed
		if k.job == m.Job && k.gen < m.Generation {
			a.conn.Close()
			delete(t.arrivals, k)
		}
	}
	t.mu.Unlock()

	conns := make([]net.Conn, m.World())
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	ctx, cancel := context.WithCancel(ctx) // the first failure ends the other attempts
	defer cancel()
	for j := range m.World() {
		if j == m.Rank {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if j < m.Rank {
				conns[j], err = t.dial(ctx, m, j)
			} else {
				conns[j], err = t.await(ctx, m, j)
			}
			if err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
					cancel()
				}
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		closeAll(conns)
		return nil, firstErr
	}
	return conns, nil
}

func (t *TCPTransport) dial(ctx context.Context, m Membership, j int) (net.Conn, error) {
	addr := m.Peers[j]
	backoff := 5 * time.Millisecond
	var lastErr error
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil && t.tls != nil {
			if c, err = t.handshakeTLS(ctx, c); err != nil {
				// A refused certificate (either side's), or a peer that
				// does not speak TLS: retrying cannot fix either.
				return nil, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrProtocol,
					Detail: fmt.Sprintf("TLS with rank %d at %s", j, addr), Err: err}
			}
		}
		if err == nil {
			var refused bool
			c, refused, err = t.greet(ctx, c, m, j)
			if err == nil {
				return c, nil
			}
			if refused {
				return nil, err
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrTimeout,
				Detail: fmt.Sprintf("could not reach rank %d at %s", j, addr), Err: lastErr}
		case <-time.After(backoff): // retry back-off while the peer starts listening
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// handshakeTLS is the dialer's TLS handshake on c, bounded by ctx and
// the handshake timeout; c is closed when it fails.
func (t *TCPTransport) handshakeTLS(ctx context.Context, c net.Conn) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, t.hsTimeout)
	defer cancel()
	raw := newBatchConn(c)
	tc := tls.Client(raw, t.tls.Client)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			// A plaintext rank answers a ClientHello with its own
			// handshake, or hangs up.
			return nil, fmt.Errorf("the peer does not speak TLS (a data plane without it?): %w", err)
		}
		return nil, err
	}
	return &tlsConn{Conn: tc, raw: raw}, nil
}

// greet sends our hello and reads the acceptor's reply. refused is true when
// the peer answered with a refusal, which retrying cannot fix.
func (t *TCPTransport) greet(ctx context.Context, c net.Conn, m Membership, j int) (net.Conn, bool, error) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := writeHandshake(c, helloFor(m, j)); err != nil {
		c.Close()
		return nil, false, err
	}
	reply := &phalanxpb.HelloReply{}
	ver, err := readHandshake(c, reply)
	if err != nil {
		c.Close()
		var op *net.OpError
		switch {
		case ver != 0:
			return nil, true, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrProtocol,
				Detail: fmt.Sprintf("rank %d at %s answered the handshake with garbage", j, m.Peers[j]), Err: err}
		case t.tls != nil && errors.As(err, &op) && op.Op == "remote error":
			// TLS 1.3: the acceptor checks this rank's certificate after
			// the dialer's handshake is over; its refusal is an alert.
			return nil, true, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrProtocol,
				Detail: fmt.Sprintf("TLS with rank %d at %s: it refused this rank's certificate", j, m.Peers[j]), Err: err}
		}
		return nil, false, err
	}
	if !reply.GetOk() || ver != ProtocolVersion {
		c.Close()
		kind := ErrProtocol
		if reply.GetError() == errWorldMismatch {
			kind = ErrMismatch
		}
		detail := fmt.Sprintf("rank %d at %s: %s", j, m.Peers[j], reply.GetError())
		if ver != ProtocolVersion {
			detail = fmt.Sprintf("rank %d at %s speaks data-plane protocol version %d, this rank speaks %d: %s", j, m.Peers[j], ver, ProtocolVersion, detail)
		}
		return nil, true, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: kind, Detail: detail}
	}
	c.SetDeadline(time.Time{})
	return c, false, nil
}

const errWorldMismatch = "world size mismatch"

// await claims the connection rank j dialed to us, answering its hello.
func (t *TCPTransport) await(ctx context.Context, m Membership, j int) (net.Conn, error) {
	key := connKey{m.Job, m.Generation, j, m.Rank}
	for {
		t.mu.Lock()
		a, ok := t.arrivals[key]
		rej := t.rejects[key]
		changed := t.changed
		closed := t.closed
		if ok {
			delete(t.arrivals, key)
		}
		delete(t.rejects, key)
		t.mu.Unlock()
		switch {
		case ok:
			if int(a.hello.GetWorld()) != m.World() {
				writeHandshake(a.conn, &phalanxpb.HelloReply{ProtocolVersion: ProtocolVersion, Error: errWorldMismatch})
				a.conn.Close()
				return nil, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrMismatch,
					Detail: fmt.Sprintf("rank %d believes the world has %d ranks, this rank %d", j, a.hello.GetWorld(), m.World())}
			}
			if err := writeHandshake(a.conn, &phalanxpb.HelloReply{ProtocolVersion: ProtocolVersion, Ok: true}); err != nil {
				a.conn.Close()
				return nil, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrPeerLost, Err: err}
			}
			a.conn.SetDeadline(time.Time{})
			return a.conn, nil
		case rej != nil:
			return nil, rej
		case closed:
			return nil, &OpError{Op: "connect", Rank: j, Kind: ErrClosed, Detail: "transport closed"}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.mu.Lock()
			last := t.lastReject
			t.mu.Unlock()
			detail := fmt.Sprintf("rank %d (%s) did not connect", j, m.Peers[j])
			if last != "" {
				detail += "; last refused connection: " + last
			}
			return nil, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrTimeout, Detail: detail, Err: ctx.Err()}
		}
	}
}
