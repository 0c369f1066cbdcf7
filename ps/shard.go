package ps

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/internal/plant"
)

// replier is where a request's answer goes: the connection it came on.
type replier interface {
	// answer writes an answer to req (FlagResponse is set by the caller).
	answer(h Header, keys []uint64, values []float32) error
	// fail writes an error answer.
	fail(h Header, st Status, msg string) error
}

// request is a frame for a shard. The shard owns it (and its body buffer)
// until it answers; release gives the buffer back to its connection.
type request struct {
	Frame
	from    replier
	release func()
}

func (r *request) done() {
	if r.release != nil {
		r.release()
		r.release = nil
	}
}

// Replica is how a primary reaches one backup of a shard: it sends state
// changes in order and is told of each one's acknowledgement (by seq) on
// the shard's actor.
type Replica interface {
	// Send forwards a change; seq increases by one with each call.
	Send(seq uint64, h Header, keys []uint64, values []float32) error
	Addr() string
	Close() error
}

// replAck tells a primary's shard actor that a backup applied change seq
// (err: the backup failed it or its link broke).
type replAck struct {
	backup string
	seq    uint64
	err    error
}

// deadlineTick tells a hybrid shard that a table's open clock reached its
// deadline.
type deadlineTick struct {
	table uint32
	clock int64
}

// Role is what a shard actor does for its shard.
type Role struct {
	// Primary serves workers and forwards every change to Backups; a
	// backup applies what its primary forwards and refuses workers.
	Primary bool
	// Backups are the backups' links (primary only).
	Backups []Replica
	// Generation is the shard map's generation that gave the role.
	Generation uint64
}

// maxCatchUp bounds the hybrid clocks a promoted primary closes for a push
// ahead of its open clock.
const maxCatchUp = 4

// tableState is one table's part of a shard.
type tableState struct {
	rows    *Rows
	clocks  *Clocks
	agg     *aggregate
	waiting []*request // pulls waiting for their clock
	armed   int64      // hybrid: the clock whose deadline timer is set (-1: none)
}

// pendingPush is a change sent to the backups and not yet acknowledged by
// all of them; req (nil for a clock close) is answered once it is.
type pendingPush struct {
	req   *request
	ack   Header
	waits map[string]bool
}

// ShardConfig configures a shard.
type ShardConfig struct {
	ID     uint32
	Tables []TableSpec
	Sync   SyncSpec
	Logger *zap.Logger
	// Applied, when set, is told of every push applied or aggregated (for
	// the update logs tests compare).
	Applied func(table uint32, worker uint32, id uint64, clock int64, act PushAction)
	// After schedules f after d (default time.AfterFunc): the hybrid
	// deadlines' clock.
	After func(d time.Duration, f func())
	// OnWait, when set, is told when a pull is held for its clock.
	OnWait func(table, worker uint32, clock int64)
}

// shard is a shard's state; it outlives restarts of its actor.
type shard struct {
	cfg     ShardConfig
	tables  map[uint32]*tableState
	role    Role
	seq     uint64                  // the last change forwarded to the backups
	pending map[uint64]*pendingPush // by seq, while backups have not acknowledged
	order   []*pendingPush          // every unanswered push, oldest first: acknowledgements go out in order
	scratch []float32
	starts  int
}

// newShard builds a shard's empty state.
func newShard(cfg ShardConfig) (*shard, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.After == nil {
		cfg.After = func(d time.Duration, f func()) { time.AfterFunc(d, f) }
	}
	s := &shard{cfg: cfg, tables: map[uint32]*tableState{}, pending: map[uint64]*pendingPush{}}
	for _, spec := range cfg.Tables {
		if err := spec.Validate(); err != nil {
			return nil, err
		}
		if s.tables[spec.ID] != nil {
			return nil, fmt.Errorf("ps: table id %d given twice", spec.ID)
		}
		c, err := NewClocks(cfg.Sync)
		if err != nil {
			return nil, err
		}
		s.tables[spec.ID] = &tableState{rows: NewRows(spec), clocks: c, agg: newAggregate(spec.Dim), armed: -1}
	}
	return s, nil
}

// NewShardProps returns the props of a shard actor for cfg: the actor owns
// the shard's rows and consistency state and answers the requests its
// server routes to it. The state outlives the actor: a restarted actor goes
// on with it. It starts as a backup until given a Role.
func NewShardProps(cfg ShardConfig) (*actor.Props, error) {
	s, err := newShard(cfg)
	if err != nil {
		return nil, err
	}
	return actor.PropsFromProducer(func() actor.Actor { return &shardActor{s: s} }), nil
}

type shardActor struct{ s *shard }

func (a *shardActor) Receive(ctx actor.Context) {
	s := a.s
	switch m := ctx.Message().(type) {
	case *actor.Started:
		s.starts++
		if s.starts > 1 {
			s.cfg.Logger.Warn("shard actor restarted", zap.Uint32("shard", s.cfg.ID), zap.Int("restarts", s.starts-1))
		}
	case *request:
		s.handleSupervised(ctx, m)
	case *replAck:
		s.acked(ctx, m)
	case *deadlineTick:
		s.deadline(ctx, m)
	case *Role:
		s.setRole(ctx, m)
	case *inspect:
		m.reply <- m.f(s)
	}
}

// inspect runs f on the shard's goroutine (for tests and checkpoints).
type inspect struct {
	f     func(*shard) any
	reply chan any
}

// handleSupervised handles a request; a panic answers it as unavailable
// (the client sends it again, with the same push id) and is raised again,
// so that the supervisor restarts the actor, which keeps the shard's state.
func (s *shard) handleSupervised(ctx actor.Context, r *request) {
	answered := false
	defer func() {
		if v := recover(); v != nil {
			if !answered && r.release != nil {
				s.refuse(r, StatusUnavailable, fmt.Sprintf("shard %d failed handling a %v: %v", s.cfg.ID, r.Op, v))
			}
			panic(v)
		}
	}()
	s.handle(ctx, r)
	answered = true
}

func (s *shard) handle(ctx actor.Context, r *request) {
	switch {
	case r.Op == OpReplicate:
		if s.role.Primary {
			s.refuse(r, StatusNotPrimary, fmt.Sprintf("shard %d: this server is its primary, not a backup (generation %d)", s.cfg.ID, s.role.Generation))
			return
		}
		s.replicated(ctx, r)
	case !s.role.Primary && (r.Op == OpPull || r.Op == OpPush):
		s.refuse(r, StatusNotPrimary, fmt.Sprintf("shard %d: this server is not its primary (generation %d)", s.cfg.ID, s.role.Generation))
	case r.Op == OpPull:
		s.pull(r)
	case r.Op == OpPush:
		s.push(ctx, r)
	case r.Op == OpInfo:
		s.info(r)
	case r.Op == OpRows:
		s.rowsOf(r)
	default:
		s.refuse(r, StatusBadRequest, fmt.Sprintf("shard %d: %v is not a request", s.cfg.ID, r.Op))
	}
}

func (s *shard) refuse(r *request, st Status, msg string) {
	if err := r.from.fail(r.Header, st, msg); err != nil {
		s.cfg.Logger.Debug("answering", zap.Error(err))
	}
	r.done()
}

// table checks a request's table, row width and keys.
func (s *shard) table(r *request, withValues bool) (*tableState, error) {
	t := s.tables[r.Table]
	if t == nil {
		return nil, fmt.Errorf("shard %d: no table %d", s.cfg.ID, r.Table)
	}
	spec := t.rows.Spec()
	if withValues || r.Op == OpPull {
		if int(r.Dim) != spec.Dim {
			return nil, fmt.Errorf("shard %d: table %q has rows of %d, the request %d", s.cfg.ID, spec.Name, spec.Dim, r.Dim)
		}
	}
	if spec.Rows != 0 {
		for _, k := range r.Keys {
			if err := spec.CheckKey(k); err != nil {
				return nil, err
			}
		}
	}
	if withValues {
		if i := nonFinite(r.Values); i >= 0 {
			return nil, fmt.Errorf("shard %d: table %q: gradient of key %d is %v", s.cfg.ID, spec.Name, r.Keys[i/spec.Dim], r.Values[i])
		}
	}
	return t, nil
}

func (s *shard) pull(r *request) {
	t, err := s.table(r, false)
	if err != nil {
		s.refuse(r, StatusBadRequest, err.Error())
		return
	}
	if !t.clocks.CanPull(r.Clock) {
		t.waiting = append(t.waiting, r)
		if s.cfg.OnWait != nil {
			s.cfg.OnWait(r.Table, r.Worker, r.Clock)
		}
		return
	}
	s.answerPull(t, r)
}

func (s *shard) answerPull(t *tableState, r *request) {
	n := len(r.Keys) * t.rows.Spec().Dim
	if cap(s.scratch) < n {
		s.scratch = make([]float32, n)
	}
	out := s.scratch[:n]
	t.rows.Pull(r.Keys, out)
	h := r.Header
	h.Flags, h.Clock = FlagResponse, t.clocks.Clock()
	if err := r.from.answer(h, r.Keys, out); err != nil {
		s.cfg.Logger.Debug("answering a pull", zap.Error(err))
	}
	r.done()
}

// take applies a push's decision to a table and counts what it applied;
// it is the same on a primary and its backups.
func (s *shard) take(t *tableState, r *request) (PushAction, error) {
	act, err := t.clocks.Push(int(r.Worker), r.ID, r.Clock)
	if err != nil {
		return 0, err
	}
	if act == Duplicate && plant.On(plant.PushTwice) {
		act = ApplyNow // planted: a replay applied to the rows again
	}
	switch act {
	case ApplyNow:
		t.rows.Apply(r.Keys, r.Values, 1)
	case Aggregate:
		t.agg.add(r.Keys, r.Values, 1)
	case StaleDecay:
		t.agg.add(r.Keys, r.Values, s.cfg.Sync.Decay)
	}
	if act != Duplicate {
		t.clocks.Took(int(r.Worker), r.ID)
		if s.cfg.Applied != nil {
			s.cfg.Applied(r.Table, r.Worker, r.ID, r.Clock, act)
		}
	}
	return act, nil
}

func (s *shard) push(ctx actor.Context, r *request) {
	t, err := s.table(r, true)
	if err != nil {
		s.refuse(r, StatusBadRequest, err.Error())
		return
	}
	if open, _ := t.clocks.Open(); t.clocks.Spec().Mode == Hybrid && r.Clock > open && r.Clock <= open+maxCatchUp {
		// A former primary closed these clocks (at their deadline) and
		// failed before its backups heard: close them here too.
		for c, _ := t.clocks.Open(); c < r.Clock; c, _ = t.clocks.Open() {
			s.close(ctx, r.Table, t)
		}
	}
	act, err := s.take(t, r)
	if err != nil {
		s.refuse(r, StatusBadRequest, fmt.Sprintf("shard %d: %v", s.cfg.ID, err))
		return
	}
	ack := r.Header
	ack.Flags, ack.Dim = FlagResponse, 0
	if act == StaleDrop || act == StaleDecay {
		ack.Flags |= FlagStale
	}
	if act == Duplicate { // answered after every push before it
		ack.Flags |= FlagDuplicate
		s.order = append(s.order, &pendingPush{req: r, ack: ack})
		s.flushAcks()
	} else {
		s.forward(r, ack, r.Header, r.Keys, r.Values)
	}
	if !t.clocks.Spec().Mode.aggregates() {
		if len(t.waiting) > 0 && act != Duplicate { // ssp: the slowest may have moved
			s.serveWaiting(t)
		}
	} else {
		if t.clocks.ShouldClose(false) {
			s.close(ctx, r.Table, t)
		} else if _, n := t.clocks.Open(); n > 0 {
			s.arm(ctx, r.Table, t)
		}
	}
}

func (s *shard) answerAck(r *request, ack Header) {
	if err := r.from.answer(ack, nil, nil); err != nil {
		s.cfg.Logger.Debug("answering a push", zap.Error(err))
	}
	r.done()
}

// forward sends a change to every backup; req, when not nil, is answered
// with ack once all have applied it (at once without backups).
func (s *shard) forward(req *request, ack Header, h Header, keys []uint64, values []float32) {
	if len(s.role.Backups) == 0 {
		if req != nil {
			s.order = append(s.order, &pendingPush{req: req, ack: ack})
			s.flushAcks()
		}
		return
	}
	s.seq++
	p := &pendingPush{req: req, ack: ack, waits: map[string]bool{}}
	h.Op, h.Flags = OpReplicate, h.Flags&FlagClose
	h.Shard = s.cfg.ID
	for _, b := range s.role.Backups {
		if req != nil && req.Worker == 1 && req.ID == 500 && plant.On(plant.LoseAckedPush) {
			continue // planted: share 1's step 500 acknowledged, never forwarded
		}
		if err := b.Send(s.seq, h, keys, values); err != nil {
			s.cfg.Logger.Warn("forwarding to a backup", zap.Uint32("shard", s.cfg.ID), zap.String("backup", b.Addr()), zap.Error(err))
			continue // its link reports the failure; the shard map will drop it
		}
		p.waits[b.Addr()] = true
	}
	if req != nil {
		req.done() // the body was written to every backup; the answer needs only the header
	}
	if len(p.waits) > 0 {
		s.pending[s.seq] = p
	}
	s.order = append(s.order, p)
	s.flushAcks()
}

func (s *shard) clockOf(table uint32) int64 {
	if t := s.tables[table]; t != nil {
		return t.clocks.Clock()
	}
	return 0
}

// acked records a backup's acknowledgement and answers the pushes every
// backup has applied, in order.
func (s *shard) acked(_ actor.Context, m *replAck) {
	if m.err != nil {
		s.cfg.Logger.Warn("a backup failed", zap.Uint32("shard", s.cfg.ID), zap.String("backup", m.backup), zap.Error(m.err))
		return // the pushes wait for the shard map without it
	}
	if p := s.pending[m.seq]; p != nil {
		delete(p.waits, m.backup)
		if len(p.waits) == 0 {
			delete(s.pending, m.seq)
		}
	}
	s.flushAcks()
}

func (s *shard) flushAcks() {
	n := 0
	for _, p := range s.order {
		if len(p.waits) > 0 {
			break
		}
		n++
		if p.req != nil {
			p.ack.Clock = s.clockOf(p.req.Table)
			s.answerAck(p.req, p.ack)
		}
	}
	clear(s.order[:n])
	s.order = s.order[n:]
}

// close closes a table's open clock: its summed gradients, divided by the
// number of workers that pushed it, are applied; the backups are told; the
// pulls it held are served.
func (s *shard) close(ctx actor.Context, table uint32, t *tableState) {
	clock, _ := t.clocks.Open()
	n := t.clocks.Close()
	if len(t.agg.keys) > 0 {
		t.rows.Apply(t.agg.keys, t.agg.sums, 1/float32(max(n, 1)))
	}
	t.agg.reset()
	if s.role.Primary {
		s.forward(nil, Header{}, Header{Table: table, Clock: clock, Flags: FlagClose}, nil, nil)
	}
	s.serveWaiting(t)
}

func (s *shard) serveWaiting(t *tableState) {
	w := t.waiting[:0]
	for _, r := range t.waiting {
		if t.clocks.CanPull(r.Clock) {
			if r.Op == OpRows {
				s.rowsOf(r)
			} else {
				s.answerPull(t, r)
			}
		} else {
			w = append(w, r)
		}
	}
	clear(t.waiting[len(w):])
	t.waiting = w
}

// arm sets the hybrid deadline of a table's open clock, once per clock.
func (s *shard) arm(ctx actor.Context, table uint32, t *tableState) {
	if t.clocks.Spec().Mode != Hybrid {
		return
	}
	clock, _ := t.clocks.Open()
	if t.armed == clock {
		return
	}
	t.armed = clock
	sys, self := ctx.ActorSystem(), ctx.Self()
	s.cfg.After(s.cfg.Sync.Deadline, func() { sys.Root.Send(self, &deadlineTick{table: table, clock: clock}) })
}

func (s *shard) deadline(ctx actor.Context, m *deadlineTick) {
	t := s.tables[m.table]
	if t == nil || !s.role.Primary {
		return
	}
	if clock, _ := t.clocks.Open(); clock == m.clock && t.clocks.ShouldClose(true) {
		s.close(ctx, m.table, t)
	}
}

// replicated applies a change its primary forwarded, in the primary's
// order, and acknowledges it.
func (s *shard) replicated(ctx actor.Context, r *request) {
	t := s.tables[r.Table]
	var err error
	switch {
	case t == nil:
		err = fmt.Errorf("shard %d: no table %d", s.cfg.ID, r.Table)
	case r.Flags&FlagClose != 0:
		if clock, _ := t.clocks.Open(); clock != r.Clock {
			err = fmt.Errorf("shard %d: the primary closed clock %d, this backup's open clock is %d", s.cfg.ID, r.Clock, clock)
		} else {
			s.close(ctx, r.Table, t)
		}
	default:
		if _, err = s.table(r, true); err == nil {
			_, err = s.take(t, r)
		}
	}
	if err != nil {
		s.cfg.Logger.Error("a replicated change failed: this backup diverges from its primary", zap.Uint32("shard", s.cfg.ID), zap.Error(err))
		s.refuse(r, StatusBadRequest, err.Error())
		return
	}
	ack := r.Header
	ack.Flags, ack.Count, ack.Dim = FlagResponse, 0, 0
	s.answerAck(r, ack)
}

// setRole makes the shard a primary (with backups) or a backup. A backup
// promoted keeps its state: the replicated changes; pulls waiting on a
// former primary are its clients' to retry.
func (s *shard) setRole(ctx actor.Context, r *Role) {
	was := s.role
	s.role = *r
	for _, b := range was.Backups {
		if !containsReplica(r.Backups, b) {
			b.Close()
		}
	}
	// Pushes waiting for a backup no longer in the map need it no longer.
	for seq, p := range s.pending {
		for addr := range p.waits {
			if !containsAddr(r.Backups, addr) {
				delete(p.waits, addr)
			}
		}
		if len(p.waits) == 0 {
			delete(s.pending, seq)
		}
	}
	s.flushAcks()
	if r.Primary {
		for id, t := range s.tables {
			if t.clocks.Spec().Mode.aggregates() && t.clocks.ShouldClose(false) {
				s.close(ctx, id, t)
			} else if _, n := t.clocks.Open(); n > 0 {
				t.armed = -1
				s.arm(ctx, id, t)
			}
		}
	} else {
		for _, t := range s.tables { // a demoted primary's waiting pulls go elsewhere
			for _, w := range t.waiting {
				s.refuse(w, StatusNotPrimary, fmt.Sprintf("shard %d: this server is no longer its primary", s.cfg.ID))
			}
			t.waiting = nil
		}
	}
}

func containsReplica(rs []Replica, r Replica) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

func containsAddr(rs []Replica, addr string) bool {
	for _, x := range rs {
		if x.Addr() == addr {
			return true
		}
	}
	return false
}

// info answers OpInfo: Clock, and as keys the table's row count, each
// worker's last push id, each worker's pushes taken, each worker's
// duplicates refused, the clocks' base, then each worker's first push id
// taken twice and first one skipped (PushCounts).
func (s *shard) info(r *request) {
	t := s.tables[r.Table]
	if t == nil {
		s.refuse(r, StatusBadRequest, fmt.Sprintf("shard %d: no table %d", s.cfg.ID, r.Table))
		return
	}
	c := t.clocks
	keys := append([]uint64{uint64(t.rows.Len())}, c.LastIDs()...)
	keys = append(keys, c.applied...)
	keys = append(keys, c.dups...)
	keys = append(keys, uint64(max(c.base, 0)))
	keys = append(keys, c.again...)
	keys = append(keys, c.skipped...)
	h := r.Header
	h.Flags, h.Clock, h.Dim = FlagResponse, t.clocks.Clock(), 0
	if err := r.from.answer(h, keys, nil); err != nil {
		s.cfg.Logger.Debug("answering info", zap.Error(err))
	}
	r.done()
}

// rowsOf answers OpRows once the table's clocks before r.Clock are applied
// (bsp, hybrid; like a pull): every row's key and whole storage (values,
// then optimizer state; Dim is the stride), and the shard's clock: a
// consistent snapshot for a checkpoint.
func (s *shard) rowsOf(r *request) {
	t := s.tables[r.Table]
	if t == nil {
		s.refuse(r, StatusBadRequest, fmt.Sprintf("shard %d: no table %d", s.cfg.ID, r.Table))
		return
	}
	if !t.clocks.CanPull(r.Clock) {
		t.waiting = append(t.waiting, r)
		return
	}
	sn := t.snapshot(r.Table)
	h := r.Header
	h.Flags, h.Clock, h.Dim = FlagResponse, sn.Clock, uint32(sn.Stride)
	if err := r.from.answer(h, sn.Keys, sn.Rows); err != nil {
		s.cfg.Logger.Debug("answering rows", zap.Error(err))
	}
	r.done()
}

// aggregate is the open clock's summed gradients of one table.
type aggregate struct {
	dim   int
	index map[uint64]int32
	keys  []uint64
	sums  []float32
}

func newAggregate(dim int) *aggregate { return &aggregate{dim: dim, index: map[uint64]int32{}} }

func (a *aggregate) add(keys []uint64, grads []float32, scale float32) {
	d := a.dim
	for i, k := range keys {
		j, ok := a.index[k]
		if !ok {
			j = int32(len(a.keys))
			a.index[k] = j
			a.keys = append(a.keys, k)
			a.sums = append(a.sums, make([]float32, d)...)
		}
		dst, g := a.sums[int(j)*d:int(j+1)*d], grads[i*d:(i+1)*d]
		for x := range dst {
			dst[x] += scale * g[x]
		}
	}
}

func (a *aggregate) reset() {
	clear(a.index)
	a.keys, a.sums = a.keys[:0], a.sums[:0]
}

// nonFinite is the index of the first NaN or infinity in v, or -1: an
// exponent of all ones, tested on the bits eight floats at a time.
func nonFinite(v []float32) int {
	const exp = 0x7f800000
	if len(v) == 0 {
		return -1
	}
	u := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(v))), len(v))
	i := 0
	for ; i+8 <= len(u); i += 8 {
		x := u[i : i+8 : i+8]
		if x[0]&exp == exp || x[1]&exp == exp || x[2]&exp == exp || x[3]&exp == exp ||
			x[4]&exp == exp || x[5]&exp == exp || x[6]&exp == exp || x[7]&exp == exp {
			break
		}
	}
	for ; i < len(u); i++ {
		if u[i]&exp == exp {
			return i
		}
	}
	return -1
}
