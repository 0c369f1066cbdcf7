package ps

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/actors"
	"github.com/phalanx-rt/phalanx/internal/netaddr"
)

// ServerConfig configures a parameter server process's data plane.
type ServerConfig struct {
	// Addr is where to listen (127.0.0.1:0 picks a port).
	Addr string
	// Advertise is the address clients dial, when it is not Addr: host:port,
	// or a host alone, which takes the bound port. A bind of every
	// interface needs one.
	Advertise string
	Tables    []TableSpec
	Sync      SyncSpec
	// System hosts the shard actors, under a supervisor of the server's.
	System *actors.System
	Logger *zap.Logger
	// Applied, when set, is told of every push a shard takes (tests).
	Applied func(shard, table, worker uint32, id uint64, clock int64, act PushAction)
	// InFlight bounds the requests of one connection being handled at
	// once (default 64): a client sending faster waits on TCP.
	InFlight int
	// Budget bounds the shard actors' restarts (default actors.DefaultBudget).
	Budget *actors.Budget
	// TLS, when set, is the listener's side of mutual TLS (the job's:
	// pki): a client whose certificate it refuses, or a plaintext one, is
	// closed and logged at warn with its address and the reason.
	// DialTLS is the client side the server dials its shards' backups
	// with. Both or neither.
	TLS, DialTLS *tls.Config
	// After schedules the hybrid deadlines (default time.AfterFunc); OnWait,
	// when set, is told when a pull is held for its clock (tests).
	After  func(d time.Duration, f func())
	OnWait func(shard, table, worker uint32, clock int64)
}

// Server serves the shards it hosts over TCP: requests are decoded on each
// connection's goroutine and handed, with their buffers, to the shard's
// actor, which answers on the connection.
type Server struct {
	cfg  ServerConfig
	ln   net.Listener
	log  *zap.Logger
	sup  *actors.Supervisor
	pool sync.Pool // *Buffer

	mu     sync.Mutex
	shards map[uint32]*actor.PID
	links  map[uint32]map[string]*replicaLink // a primary's links to its shards' backups, reused across roles
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen starts a server hosting no shards yet (see Host).
func Listen(cfg ServerConfig) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.InFlight <= 0 {
		cfg.InFlight = 64
	}
	if cfg.System == nil {
		return nil, errors.New("ps: a server needs an actor system")
	}
	if err := cfg.Sync.Validate(); err != nil {
		return nil, err
	}
	for i := range cfg.Tables {
		if err := cfg.Tables[i].Validate(); err != nil {
			return nil, err
		}
	}
	if err := netaddr.Check(cfg.Addr, cfg.Advertise); err != nil {
		return nil, fmt.Errorf("ps: %w", err)
	}
	if (cfg.TLS == nil) != (cfg.DialTLS == nil) {
		return nil, errors.New("ps: TLS needs both the listener's and the dialer's configuration")
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("ps: listening on %s: %w", cfg.Addr, err)
	}
	s := &Server{cfg: cfg, ln: ln, log: cfg.Logger, shards: map[uint32]*actor.PID{}, links: map[uint32]map[string]*replicaLink{}, conns: map[net.Conn]struct{}{}}
	s.pool.New = func() any { return new(Buffer) }
	budget := actors.DefaultBudget()
	if cfg.Budget != nil {
		budget = *cfg.Budget
	}
	sup, _, err := actors.Supervise(cfg.System, fmt.Sprintf("ps-%s", ln.Addr()), budget, cfg.Logger)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s.sup = sup
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the address clients dial: the advertised one, else the bound one.
func (s *Server) Addr() string {
	if a := netaddr.Advertised(s.cfg.Advertise, s.ln.Addr().(*net.TCPAddr).Port); a != "" {
		return a
	}
	return s.ln.Addr().String()
}

// GaveUp delivers a shard actor's failure beyond its restart budget: the
// process should exit and let a backup take over.
func (s *Server) GaveUp() <-chan *actors.GiveUpError { return s.sup.GaveUp() }

// Host starts the actor of shard id, as a backup until SetRole.
func (s *Server) Host(ctx context.Context, id uint32) error {
	s.mu.Lock()
	if s.shards[id] != nil {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	applied := s.cfg.Applied
	onWait := s.cfg.OnWait
	props, err := NewShardProps(ShardConfig{ID: id, Tables: s.cfg.Tables, Sync: s.cfg.Sync, Logger: s.log, After: s.cfg.After,
		OnWait: func(table, worker uint32, clock int64) {
			if onWait != nil {
				onWait(id, table, worker, clock)
			}
		},
		Applied: func(table, worker uint32, pid uint64, clock int64, act PushAction) {
			if applied != nil {
				applied(id, table, worker, pid, clock, act)
			}
		}})
	if err != nil {
		return err
	}
	pid, err := s.sup.Spawn(ctx, actors.Child{Name: fmt.Sprintf("shard%d", id), Props: props})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.shards[id] = pid
	s.mu.Unlock()
	return nil
}

// SetRole makes this server shard id's primary, forwarding to the backups
// at backups, or one of its backups (primary false). It dials the backups.
func (s *Server) SetRole(ctx context.Context, id uint32, primary bool, backups []string, generation uint64) error {
	s.mu.Lock()
	pid := s.shards[id]
	s.mu.Unlock()
	if pid == nil {
		return fmt.Errorf("ps: shard %d is not hosted here", id)
	}
	role := &Role{Primary: primary, Generation: generation}
	s.mu.Lock()
	old := s.links[id]
	s.mu.Unlock()
	links := map[string]*replicaLink{}
	if primary {
		sys := s.cfg.System
		for _, addr := range backups {
			if l := old[addr]; l != nil && !l.broken() { // changes in flight on it keep their order
				links[addr] = l
			} else {
				l, err := dialReplica(ctx, addr, id, s.cfg.DialTLS, s.log, func(a *replAck) { sys.Root.Send(pid, a) })
				if err != nil {
					return err
				}
				links[addr] = l
			}
			role.Backups = append(role.Backups, links[addr])
		}
	}
	s.mu.Lock()
	s.links[id] = links
	s.mu.Unlock()
	s.cfg.System.Root.Send(pid, role)
	return nil
}

// shard runs f on shard id's actor and returns its result.
func (s *Server) inspect(ctx context.Context, id uint32, f func(*shard) any) (any, error) {
	s.mu.Lock()
	pid := s.shards[id]
	s.mu.Unlock()
	if pid == nil {
		return nil, fmt.Errorf("ps: shard %d is not hosted here", id)
	}
	reply := make(chan any, 1)
	s.cfg.System.Root.Send(pid, &inspect{f: f, reply: reply})
	select {
	case v := <-reply:
		return v, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops accepting, closes every connection and stops the shard
// actors.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	s.sup.Close()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// serverConn is one client's connection: answers are written under mu.
type serverConn struct {
	c  net.Conn
	mu sync.Mutex
	bw *bufio.Writer
	w  *Writer
}

func (sc *serverConn) answer(h Header, keys []uint64, values []float32) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	h.Flags |= FlagResponse
	if err := sc.w.Write(h, keys, values); err != nil {
		return err
	}
	return sc.bw.Flush()
}

func (sc *serverConn) fail(h Header, st Status, msg string) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if err := sc.w.WriteError(h, st, msg); err != nil {
		return err
	}
	return sc.bw.Flush()
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func(raw net.Conn) {
		s.mu.Lock()
		delete(s.conns, raw)
		s.mu.Unlock()
		raw.Close()
	}(c)
	tune(c)
	raw := c
	if s.cfg.TLS != nil {
		tc := tls.Server(c, s.cfg.TLS)
		tc.SetDeadline(time.Now().Add(handshakeTimeout))
		if err := tc.Handshake(); err != nil {
			s.log.Warn("ps: refused a connection: TLS", zap.String("peer", raw.RemoteAddr().String()), zap.String("reason", err.Error()))
			var plain tls.RecordHeaderError
			if errors.As(err, &plain) && plain.Conn != nil {
				tellPlaintext(raw)
			}
			return
		}
		tc.SetDeadline(time.Time{})
		c = tc
	}
	bw := bufio.NewWriterSize(c, 1<<16)
	sc := &serverConn{c: c, bw: bw, w: NewWriter(bw)}
	slots := make(chan struct{}, s.cfg.InFlight)
	var hdr [headerSize]byte
	br := bufio.NewReaderSize(c, 1<<16)
	for {
		slots <- struct{}{}
		buf := s.pool.Get().(*Buffer)
		f, err := ReadFrame(br, &hdr, buf)
		if err != nil {
			s.pool.Put(buf)
			var fe *FrameError
			if errors.As(err, &fe) {
				s.log.Warn("closing a connection speaking garbage", zap.String("peer", c.RemoteAddr().String()), zap.Error(err))
				sc.fail(Header{Op: OpInfo}, StatusBadRequest, err.Error())
			} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Debug("connection ended", zap.String("peer", c.RemoteAddr().String()), zap.Error(err))
			}
			return
		}
		if f.Flags&FlagResponse != 0 {
			s.pool.Put(buf)
			s.log.Warn("closing a connection that sent an answer as a request", zap.String("peer", c.RemoteAddr().String()))
			return
		}
		s.mu.Lock()
		pid := s.shards[f.Shard]
		s.mu.Unlock()
		if pid == nil {
			s.pool.Put(buf)
			<-slots
			sc.fail(f.Header, StatusNotPrimary, fmt.Sprintf("shard %d is not hosted on %s", f.Shard, s.Addr()))
			continue
		}
		var once sync.Once
		s.cfg.System.Root.Send(pid, &request{Frame: f, from: sc, release: func() {
			once.Do(func() {
				s.pool.Put(buf)
				<-slots
			})
		}})
	}
}

// replicaLink is a primary's connection to one backup of a shard.
type replicaLink struct {
	addr string
	c    net.Conn
	mu   sync.Mutex
	bw   *bufio.Writer
	w    *Writer
	done chan struct{}
}

// dialReplica connects to a backup; notify is told of each acknowledgement,
// and of the link's failure.
func dialReplica(ctx context.Context, addr string, shard uint32, tlsCfg *tls.Config, log *zap.Logger, notify func(*replAck)) (*replicaLink, error) {
	c, err := dial(ctx, addr, tlsCfg)
	if err != nil {
		return nil, fmt.Errorf("ps: connecting to shard %d's backup %s: %w", shard, addr, err)
	}
	bw := bufio.NewWriterSize(c, 1<<16)
	l := &replicaLink{addr: addr, c: c, bw: bw, w: NewWriter(bw), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		var hdr [headerSize]byte
		var buf Buffer
		br := bufio.NewReaderSize(c, 1<<16)
		for {
			f, err := ReadFrame(br, &hdr, &buf)
			if err != nil {
				notify(&replAck{backup: addr, err: fmt.Errorf("link to backup %s: %w", addr, err)})
				return
			}
			if f.Status != StatusOK {
				notify(&replAck{backup: addr, seq: f.Seq, err: fmt.Errorf("backup %s: %v: %s", addr, f.Status, f.Message)})
				continue
			}
			notify(&replAck{backup: addr, seq: f.Seq})
		}
	}()
	return l, nil
}

func (l *replicaLink) Addr() string { return l.addr }

func (l *replicaLink) broken() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *replicaLink) Send(seq uint64, h Header, keys []uint64, values []float32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	h.Seq = seq
	if err := l.w.Write(h, keys, values); err != nil {
		return err
	}
	return l.bw.Flush()
}

func (l *replicaLink) Close() error {
	err := l.c.Close()
	<-l.done
	return err
}

// tune sets a data-plane connection's options: no Nagle delay, and socket
// buffers big enough for a frame of thousands of rows in few system calls.
// tellPlaintext answers a client that spoke plaintext to a server with TLS
// in its own protocol, so that its call fails saying why rather than on
// a closed connection: the server half-closes, then drains what the
// client sent (a close with unread bytes would reset the answer away).
func tellPlaintext(c net.Conn) {
	c.SetDeadline(time.Now().Add(time.Second))
	bw := bufio.NewWriter(c)
	sc := &serverConn{c: c, bw: bw, w: NewWriter(bw)}
	if sc.fail(Header{Op: OpInfo}, StatusBadRequest, "this parameter server requires mutual TLS (a certificate of the job's CA)") != nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, c)
}

// handshakeTimeout bounds a TLS handshake of the parameter servers' plane.
const handshakeTimeout = 10 * time.Second

// dial connects to a server at addr, over TLS with tlsCfg (the job's
// client side) when set.
func dial(ctx context.Context, addr string, tlsCfg *tls.Config) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tune(c)
	if tlsCfg == nil {
		return c, nil
	}
	tc := tls.Client(c, tlsCfg)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS: %w", err)
	}
	return tc, nil
}

func tune(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetReadBuffer(4 << 20)
		tc.SetWriteBuffer(4 << 20)
	}
}
