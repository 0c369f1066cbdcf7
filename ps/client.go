package ps

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/pki"
)

// Directory tells a client where each shard's primary is. The coordinator's
// shard map in etcd is the real one; a fixed map serves tests.
type Directory interface {
	// Primary is the address of shard's primary in the map's generation.
	Primary(shard int) (addr string, generation uint64, err error)
	// Changed returns once the map's generation is past generation.
	Changed(ctx context.Context, generation uint64) error
}

// StaticDirectory is a shard map that never changes: Addrs[shard].
type StaticDirectory []string

// Primary implements Directory.
func (d StaticDirectory) Primary(shard int) (string, uint64, error) {
	if shard < 0 || shard >= len(d) {
		return "", 0, fmt.Errorf("ps: no shard %d in a map of %d", shard, len(d))
	}
	return d[shard], 1, nil
}

// Changed implements Directory: a static map never changes.
func (d StaticDirectory) Changed(ctx context.Context, _ uint64) error {
	<-ctx.Done()
	return ctx.Err()
}

// RemoteError is an error answer from a server.
type RemoteError struct {
	Status  Status
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("ps: server answered %v: %s", e.Status, e.Message)
}

// retryable reports whether a failed sub-request should go again, after the
// shard map changes: its server is gone, or is no longer the primary.
func retryable(err error) bool {
	var re *RemoteError
	if errors.As(err, &re) {
		return re.Status == StatusNotPrimary || re.Status == StatusUnavailable
	}
	// A refused certificate, either way, or a server without TLS: trying
	// again cannot change the answer.
	var peer *pki.PeerError
	var header tls.RecordHeaderError
	var op *net.OpError
	if errors.As(err, &peer) || errors.As(err, &header) || errors.As(err, &op) && op.Op == "remote error" { // crypto/tls's received alert
		return false
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// ClientConfig configures a worker's client.
type ClientConfig struct {
	Worker    int
	Tables    []TableSpec
	Partition Partition
	Shards    int
	Sync      SyncSpec
	Directory Directory
	Logger    *zap.Logger
	// TLS, when set, is the job's client side of mutual TLS: every
	// server is dialed over it (a server with TLS refuses plaintext).
	TLS *tls.Config
	// CacheRows, when not 0, keeps up to this many pulled rows per table
	// on the worker (hot keys): a cached row serves a pull while this
	// worker's clock on its shard is at most CacheStaleness clocks past
	// the clock it was pulled at (its own pushes since included).
	CacheRows      int
	CacheStaleness int64
}

// Client is a worker's access to the parameter server: Pull and Push split
// their keys by shard, send one frame per shard, in parallel, and gather
// the answers in the caller's order. A request whose server fails is sent
// again to the shard's next primary (a push keeps its id, so it is applied
// once). Pull and Push are not safe for concurrent use.
type Client struct {
	cfg    ClientConfig
	tables map[uint32]*tableClient

	mu    sync.Mutex
	conns map[string]*clientConn
	// pushes and pulls count this client's requests, for metrics.
	pushes, pulls atomic.Int64
}

// tableClient is a table's partition and per-shard state.
type tableClient struct {
	spec  TableSpec
	part  *Partitioner
	clock []int64  // the clock of this worker on each shard
	ids   []uint64 // the last push id sent to each shard
	// step is how many steps this worker (share) has pushed: the next
	// push is step+1 and has that id on every shard, so a push's id
	// names the share's step and survives the process that sent it.
	step  int64
	dups  int64 // pushes a shard answered as duplicates
	sub   []subRequest
	cache *rowCache
}

// subRequest is one shard's part of a request.
type subRequest struct {
	keys []uint64
	pos  []int32 // each key's place in the caller's request
	vals []float32
	ack  Header
	err  error
	// token names the call in flight: done carries it, so that the signal
	// of a call abandoned earlier is told apart.
	token uint64
	done  chan uint64
}

// finish records a call's outcome and signals it.
func (s *subRequest) finish(token uint64, err error) {
	s.err = err
	s.done <- token
}

// wait waits for the signal of the call in flight.
func (s *subRequest) wait(ctx context.Context) error {
	for {
		select {
		case t := <-s.done:
			if t == s.token {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// NewClient builds a client; it connects on first use.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if err := cfg.Sync.Validate(); err != nil {
		return nil, err
	}
	if cfg.Worker < 0 || cfg.Worker >= cfg.Sync.Workers {
		return nil, fmt.Errorf("ps: worker %d of %d", cfg.Worker, cfg.Sync.Workers)
	}
	c := &Client{cfg: cfg, tables: map[uint32]*tableClient{}, conns: map[string]*clientConn{}}
	for _, spec := range cfg.Tables {
		if err := spec.Validate(); err != nil {
			return nil, err
		}
		p, err := NewPartitioner(cfg.Partition, cfg.Shards, &spec)
		if err != nil {
			return nil, err
		}
		tc := &tableClient{spec: spec, part: p, clock: make([]int64, cfg.Shards), ids: make([]uint64, cfg.Shards), sub: make([]subRequest, cfg.Shards)}
		for i := range tc.sub {
			tc.sub[i].done = make(chan uint64, 4)
		}
		if cfg.CacheRows > 0 {
			tc.cache = newRowCache(cfg.CacheRows, spec.Dim)
		}
		c.tables[spec.ID] = tc
	}
	return c, nil
}

func (c *Client) table(id uint32) (*tableClient, error) {
	tc := c.tables[id]
	if tc == nil {
		return nil, fmt.Errorf("ps: no table %d", id)
	}
	return tc, nil
}

// split sorts keys by shard into tc.sub (with values, when given).
func (tc *tableClient) split(keys []uint64, values []float32) {
	d := tc.spec.Dim
	for i := range tc.sub {
		s := &tc.sub[i]
		s.keys, s.pos, s.vals, s.err = s.keys[:0], s.pos[:0], s.vals[:0], nil
	}
	for i, k := range keys {
		s := &tc.sub[tc.part.Shard(k)]
		s.keys = append(s.keys, k)
		s.pos = append(s.pos, int32(i))
		if values != nil {
			s.vals = append(s.vals, values[i*d:(i+1)*d]...)
		}
	}
}

// Pull fills out (len(keys) × Dim) with the rows of keys, at this worker's
// clock (under bsp and ssp it waits as its consistency model says).
func (c *Client) Pull(ctx context.Context, table uint32, keys []uint64, out []float32) error {
	c.pulls.Add(1)
	tc, err := c.table(table)
	if err != nil {
		return err
	}
	d := tc.spec.Dim
	if len(out) != len(keys)*d {
		return fmt.Errorf("ps: pull of %d keys × %d into %d floats", len(keys), d, len(out))
	}
	for _, k := range keys {
		if err := tc.spec.CheckKey(k); err != nil {
			return err
		}
	}
	tc.split(keys, nil)
	if tc.cache != nil { // serve what the cache holds fresh enough
		for s := range tc.sub {
			sub := &tc.sub[s]
			n := 0
			for i, k := range sub.keys {
				if tc.cache.get(k, tc.clock[s], c.cfg.CacheStaleness, out[int(sub.pos[i])*d:int(sub.pos[i]+1)*d]) {
					continue
				}
				sub.keys[n], sub.pos[n] = k, sub.pos[i]
				n++
			}
			sub.keys, sub.pos = sub.keys[:n], sub.pos[:n]
		}
	}
	var shards []int
	for s := range tc.sub {
		if len(tc.sub[s].keys) > 0 {
			shards = append(shards, s)
		}
	}
	err = c.run(ctx, tc, shards, func(s int) Header {
		return Header{Op: OpPull, Shard: uint32(s), Table: table, Clock: tc.clock[s], Worker: uint32(c.cfg.Worker), Dim: uint32(d)}
	}, func(s int, f *Frame) error {
		sub := &tc.sub[s]
		if len(f.Keys) != len(sub.keys) || len(f.Values) != len(sub.keys)*d {
			return &RemoteError{Status: StatusBadRequest, Message: fmt.Sprintf("answered %d keys and %d floats for %d keys × %d", len(f.Keys), len(f.Values), len(sub.keys), d)}
		}
		for i, p := range sub.pos {
			copy(out[int(p)*d:int(p+1)*d], f.Values[i*d:(i+1)*d])
		}
		if tc.cache != nil {
			tc.cache.put(sub.keys, f.Values, tc.clock[s])
		}
		return nil
	})
	if err != nil {
		return err
	}
	if c.cfg.Sync.Mode == Hybrid {
		for _, s := range shards { // a late worker catches up with the shard
			tc.clock[s] = max(tc.clock[s], tc.sub[s].ack.Clock)
		}
	}
	return nil
}

// Push sends the gradients (len(keys) × Dim) of keys' rows for this worker's
// clock and advances it; it returns once every replica of every shard has
// taken them, with how many shards took them as stale (hybrid). Under bsp,
// ssp and hybrid every shard hears from every worker each clock, with no
// keys when the batch touched none of its rows. Keys should be unique: a
// repeated key is one update per occurrence under asp and ssp.
func (c *Client) Push(ctx context.Context, table uint32, keys []uint64, grads []float32) (stale int, err error) {
	c.pushes.Add(1)
	tc, err := c.table(table)
	if err != nil {
		return 0, err
	}
	d := tc.spec.Dim
	if len(grads) != len(keys)*d {
		return 0, fmt.Errorf("ps: push of %d keys × %d with %d floats", len(keys), d, len(grads))
	}
	for _, k := range keys {
		if err := tc.spec.CheckKey(k); err != nil {
			return 0, err
		}
	}
	tc.split(keys, grads)
	var shards []int
	id := uint64(tc.step + 1)
	asp := c.cfg.Sync.Mode == ASP
	for s := range tc.sub {
		if len(tc.sub[s].keys) > 0 || !asp {
			shards = append(shards, s)
			tc.ids[s] = id
			if asp { // a shard's clock is the step, touched or not: a replayed step's clock is not behind it
				tc.clock[s] = tc.step
			}
		}
	}
	err = c.run(ctx, tc, shards, func(s int) Header {
		return Header{Op: OpPush, Shard: uint32(s), Table: table, Clock: tc.clock[s], Worker: uint32(c.cfg.Worker), Dim: uint32(d), ID: tc.ids[s]}
	}, nil)
	if err != nil {
		return 0, err
	}
	for _, s := range shards {
		ack := tc.sub[s].ack
		if ack.Flags&FlagStale != 0 {
			stale++
		}
		if ack.Flags&FlagDuplicate != 0 {
			tc.dups++
		}
		next := tc.clock[s] + 1
		if c.cfg.Sync.Mode == Hybrid {
			next = max(next, ack.Clock)
		}
		tc.clock[s] = next
	}
	tc.step++
	return stale, nil
}

// Requests is how many pushes and pulls this client made.
func (c *Client) Requests() (pushes, pulls int64) { return c.pushes.Load(), c.pulls.Load() }

// Duplicates is how many of this client's pushes of table a shard answered
// as applied already (the steps of a share taken over, replayed).
func (c *Client) Duplicates(table uint32) int64 {
	if tc := c.tables[table]; tc != nil {
		return tc.dups
	}
	return 0
}

// Step is how many steps of table this worker has pushed (SetClock's step
// included).
func (c *Client) Step(table uint32) int64 {
	if tc := c.tables[table]; tc != nil {
		return tc.step
	}
	return 0
}

// Clock is this worker's clock on a table's shard.
func (c *Client) Clock(table uint32, shard int) int64 {
	if tc := c.tables[table]; tc != nil && shard < len(tc.clock) {
		return tc.clock[shard]
	}
	return 0
}

// run sends each shard's sub-request and waits for every answer, sending a
// failed one again once the shard map changes.
func (c *Client) run(ctx context.Context, tc *tableClient, shards []int, header func(int) Header, got func(int, *Frame) error) error {
	pending := shards
	backoff := 5 * time.Millisecond
	for len(pending) > 0 {
		gens := make(map[int]uint64, len(pending))
		for _, s := range pending {
			sub := &tc.sub[s]
			sub.token++
			addr, gen, err := c.cfg.Directory.Primary(s)
			gens[s] = gen
			if err != nil {
				sub.finish(sub.token, err)
				continue
			}
			c.send(ctx, addr, header(s), sub, func(f *Frame) error {
				if got != nil {
					return got(s, f)
				}
				return nil
			})
		}
		var again []int
		var first error
		for _, s := range pending {
			sub := &tc.sub[s]
			if err := sub.wait(ctx); err != nil {
				c.abandon()
				return err
			}
			if sub.err == nil {
				continue
			}
			if !retryable(sub.err) {
				if first == nil {
					first = fmt.Errorf("ps: shard %d: %w", s, sub.err)
				}
				continue
			}
			c.cfg.Logger.Warn("a shard's server failed; waiting for the shard map to change", zap.Int("shard", s), zap.Error(sub.err))
			// A server may refuse before it has taken the role of a map the
			// client already holds: try again after a backoff even if the
			// map does not change.
			backoff = min(2*backoff, time.Second)
			wctx, cancel := context.WithTimeout(ctx, backoff)
			err := c.cfg.Directory.Changed(wctx, gens[s])
			cancel()
			if err != nil && ctx.Err() != nil {
				return fmt.Errorf("ps: shard %d failed (%v) and its map did not change: %w", s, sub.err, ctx.Err())
			}
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("ps: shard %d failed (%v) and its map cannot be followed: %w", s, sub.err, err)
			}
			again = append(again, s)
		}
		if first != nil {
			return first
		}
		pending = again
	}
	return nil
}

// abandon closes every connection: calls still waiting on them fail (a
// cancelled request's answer must not land in a reused buffer).
func (c *Client) abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, cc := range c.conns {
		cc.close(errors.New("ps: request cancelled"))
		<-cc.readDone // no answer lands in a caller's buffer after this
		delete(c.conns, addr)
	}
}

// Close closes the client's connections.
func (c *Client) Close() error {
	c.abandon()
	return nil
}

// send writes a sub-request to addr's connection; its answer (or failure)
// lands in sub and signals sub.done.
func (c *Client) send(ctx context.Context, addr string, h Header, sub *subRequest, got func(*Frame) error) {
	cc, err := c.conn(ctx, addr)
	if err == nil {
		err = cc.call(h, sub, got)
	}
	if err != nil {
		sub.finish(sub.token, err)
	}
}

func (c *Client) conn(ctx context.Context, addr string) (*clientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil && !cc.broken() {
		return cc, nil
	}
	cc, err := dialClient(ctx, addr, c.cfg.TLS, c.cfg.Logger)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

// clientConn is a connection to one server: calls are matched to answers
// by Seq.
type clientConn struct {
	c   net.Conn
	wmu sync.Mutex
	bw  *bufio.Writer
	w   *Writer

	mu    sync.Mutex
	seq   uint64
	calls map[uint64]*pendingCall
	err   error // set once the connection failed

	readDone chan struct{}
}

type pendingCall struct {
	sub   *subRequest
	token uint64
	got   func(*Frame) error
}

func dialClient(ctx context.Context, addr string, tlsCfg *tls.Config, log *zap.Logger) (*clientConn, error) {
	c, err := dial(ctx, addr, tlsCfg)
	if err != nil {
		return nil, fmt.Errorf("ps: connecting to %s: %w", addr, err)
	}
	bw := bufio.NewWriterSize(c, 1<<16)
	cc := &clientConn{c: c, bw: bw, w: NewWriter(bw), calls: map[uint64]*pendingCall{}, readDone: make(chan struct{})}
	go cc.read(log)
	return cc, nil
}

func (cc *clientConn) broken() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err != nil
}

func (cc *clientConn) call(h Header, sub *subRequest, got func(*Frame) error) error {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return cc.err
	}
	cc.seq++
	h.Seq = cc.seq
	cc.calls[h.Seq] = &pendingCall{sub: sub, token: sub.token, got: got}
	cc.mu.Unlock()
	cc.wmu.Lock()
	err := cc.w.Write(h, sub.keys, sub.vals[:len(sub.vals):len(sub.vals)])
	if err == nil {
		err = cc.bw.Flush()
	}
	cc.wmu.Unlock()
	if err != nil {
		cc.close(fmt.Errorf("ps: writing to %s: %w", cc.c.RemoteAddr(), err))
		return nil // close failed the call
	}
	return nil
}

// read takes answers until the connection fails, then fails every call
// still waiting.
func (cc *clientConn) read(log *zap.Logger) {
	defer close(cc.readDone)
	var hdr [headerSize]byte
	var buf Buffer
	br := bufio.NewReaderSize(cc.c, 1<<16)
	for {
		f, err := ReadFrame(br, &hdr, &buf)
		if err == nil && f.Flags&FlagResponse == 0 {
			err = &FrameError{Reason: "a request from a server"}
		}
		if err != nil {
			cc.close(fmt.Errorf("ps: connection to %s: %w", cc.c.RemoteAddr(), err))
			return
		}
		cc.mu.Lock()
		pc := cc.calls[f.Seq]
		delete(cc.calls, f.Seq)
		cc.mu.Unlock()
		if pc == nil {
			if f.Status != StatusOK && f.Seq == 0 {
				cc.close(fmt.Errorf("ps: connection to %s: %w", cc.c.RemoteAddr(), &RemoteError{Status: f.Status, Message: f.Message}))
				return
			}
			log.Warn("an answer to no request", zap.Uint64("seq", f.Seq), zap.Stringer("op", f.Op))
			continue
		}
		sub := pc.sub
		switch {
		case f.Status != StatusOK:
			sub.finish(pc.token, &RemoteError{Status: f.Status, Message: f.Message})
		default:
			sub.ack = f.Header
			var err error
			if pc.got != nil {
				err = pc.got(&f)
			}
			sub.finish(pc.token, err)
		}
	}
}

func (cc *clientConn) close(err error) {
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = err
	}
	calls := cc.calls
	cc.calls = map[uint64]*pendingCall{}
	cc.mu.Unlock()
	cc.c.Close()
	for _, pc := range calls {
		pc.sub.finish(pc.token, cc.err)
	}
}

// ShardInfo is a shard's account of one table.
type ShardInfo struct {
	Clock int64
	Rows  uint64
	// LastIDs is each worker's last push id the shard took: its last step
	// that reached the shard.
	LastIDs []uint64
	// Pushes is each worker's account (LastIDs with the counts).
	Pushes []PushCounts
}

// Info asks shard's primary for its account of table.
func (c *Client) Info(ctx context.Context, table uint32, shard int) (ShardInfo, error) {
	tc, err := c.table(table)
	if err != nil {
		return ShardInfo{}, err
	}
	if shard < 0 || shard >= len(tc.sub) {
		return ShardInfo{}, fmt.Errorf("ps: no shard %d of %d", shard, len(tc.sub))
	}
	tc.split(nil, nil)
	var info ShardInfo
	err = c.run(ctx, tc, []int{shard}, func(s int) Header {
		return Header{Op: OpInfo, Shard: uint32(s), Table: table, Worker: uint32(c.cfg.Worker)}
	}, func(_ int, f *Frame) error {
		if len(f.Keys) < 1 {
			return &RemoteError{Status: StatusBadRequest, Message: "an info answer without the row count"}
		}
		w := c.cfg.Sync.Workers
		if len(f.Keys) != 2+5*w {
			return &RemoteError{Status: StatusBadRequest, Message: fmt.Sprintf("an info answer of %d numbers for %d workers", len(f.Keys), w)}
		}
		k := f.Keys[1:]
		info = ShardInfo{Clock: f.Clock, Rows: f.Keys[0], LastIDs: append([]uint64(nil), k[:w]...), Pushes: make([]PushCounts, w)}
		for i := range w {
			info.Pushes[i] = PushCounts{Last: k[i], Applied: k[w+i], Duplicates: k[2*w+i], Base: int64(k[3*w]),
				Again: k[3*w+1+i], Skipped: k[4*w+1+i]}
		}
		return nil
	})
	return info, err
}

// CacheHits is how many rows of table pulls served from the worker's cache.
func (c *Client) CacheHits(table uint32) int64 {
	if tc := c.tables[table]; tc != nil && tc.cache != nil {
		return tc.cache.hits.Load()
	}
	return 0
}

// rowCache keeps pulled rows with the clock they were pulled at, up to a
// bound; when full, an arbitrary row (the map's iteration order) makes room.
type rowCache struct {
	dim  int
	max  int
	mu   sync.Mutex // put runs on connections' reader goroutines
	at   map[uint64]cacheEntry
	slab []float32
	free []int32
	hits atomic.Int64
}

type cacheEntry struct {
	clock int64
	slot  int32
}

func newRowCache(rows, dim int) *rowCache {
	c := &rowCache{dim: dim, max: rows, at: make(map[uint64]cacheEntry, rows), slab: make([]float32, rows*dim)}
	for i := rows - 1; i >= 0; i-- {
		c.free = append(c.free, int32(i))
	}
	return c
}

// get copies k's cached row into dst if it was pulled at most staleness
// clocks before clock.
func (c *rowCache) get(k uint64, clock, staleness int64, dst []float32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.at[k]
	if !ok || clock-e.clock > staleness {
		return false
	}
	c.hits.Add(1)
	copy(dst, c.slab[int(e.slot)*c.dim:int(e.slot+1)*c.dim])
	return true
}

func (c *rowCache) put(keys []uint64, values []float32, clock int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range keys {
		e, ok := c.at[k]
		if !ok {
			if len(c.free) == 0 {
				for victim, ve := range c.at {
					delete(c.at, victim)
					c.free = append(c.free, ve.slot)
					break
				}
			}
			e.slot = c.free[len(c.free)-1]
			c.free = c.free[:len(c.free)-1]
		}
		e.clock = clock
		c.at[k] = e
		copy(c.slab[int(e.slot)*c.dim:int(e.slot+1)*c.dim], values[i*c.dim:(i+1)*c.dim])
	}
}

// SetClock starts this worker at clock on every shard of table, its next
// push being step clock+1: a worker resuming from a checkpoint starts at
// the checkpoint's clock, and one taking over a share at the share's
// progress (a step pushed again there is a duplicate the shards ignore).
func (c *Client) SetClock(table uint32, clock int64) error {
	tc, err := c.table(table)
	if err != nil {
		return err
	}
	if clock < 0 {
		return fmt.Errorf("ps: clock %d: must not be negative", clock)
	}
	for s := range tc.clock {
		tc.clock[s] = clock
	}
	tc.step = clock
	return nil
}

// Snapshot asks shard's primary for its rows of table once every clock
// before clock is applied there (bsp and hybrid; at once under asp and ssp).
func (c *Client) Snapshot(ctx context.Context, table uint32, shard int, clock int64) (Snapshot, error) {
	tc, err := c.table(table)
	if err != nil {
		return Snapshot{}, err
	}
	if shard < 0 || shard >= len(tc.sub) {
		return Snapshot{}, fmt.Errorf("ps: no shard %d of %d", shard, len(tc.sub))
	}
	tc.split(nil, nil)
	var sn Snapshot
	err = c.run(ctx, tc, []int{shard}, func(s int) Header {
		return Header{Op: OpRows, Shard: uint32(s), Table: table, Clock: clock, Worker: uint32(c.cfg.Worker)}
	}, func(_ int, f *Frame) error {
		if int(f.Dim) < tc.spec.Dim || len(f.Values) != len(f.Keys)*int(f.Dim) {
			return &RemoteError{Status: StatusBadRequest, Message: fmt.Sprintf("rows of %d floats for a table of %d", f.Dim, tc.spec.Dim)}
		}
		sn = Snapshot{Table: table, Dim: tc.spec.Dim, Stride: int(f.Dim), Clock: f.Clock,
			Keys: append([]uint64(nil), f.Keys...), Rows: append([]float32(nil), f.Values...)}
		return nil
	})
	return sn, err
}
