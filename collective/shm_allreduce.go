package collective

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync/atomic"
	"time"
)

// shmFast is the single-copy allreduce of a group whose peers are all on
// shared memory. Each rank copies its input, one slab-sized round at a time,
// into a slab of its own segment and announces the step; then
//
//   - small rounds (up to ShmOptions.SmallBytes): every rank reduces the whole
//     round straight out of every slab, in rank order 0..N−1, so every rank
//     computes the same bits with one synchronisation;
//   - larger rounds: rank c reduces chunk c of the round out of every slab
//     (its own input straight from the caller's buffer, which is why a rank
//     does not copy its own chunk in), in rank order, one pass over the N
//     inputs a cache-sized block at a time, into its own slab and the
//     caller's buffer; it announces the chunk, and every rank copies each
//     chunk from its owner as soon as the owner announces it
//     (reduce-scatter, then allgather). Each chunk is reduced once, by its
//     owner, so every rank gets the same bits.
//
// A rank then announces it has finished reading the step. Two slabs per rank,
// used by step parity, let a rank copy in the next round while its peers
// still read the last one. Every slab carries a descriptor (job, generation,
// operation sequence, step, count, dtype, reduction) that readers check.
//
// Announcing stores the rank's own word (posted, done or read: the step) and
// adds one to the matching arrival counter of every peer, so a rank waits on
// one counter of its own for all its peers. A waiter spins for a bounded
// number of polls, then publishes the counter and target it sleeps for and
// sleeps on its own futex doorbell; the peer whose announcement reaches the
// target rings it, and nobody else does: no wake-up is spurious and no
// announcement makes a syscall when nobody sleeps. A failure of the group (a
// peer's death seen by its link, an abort, Close), a cancelled context or the
// operation's deadline also ring it.
type shmFast struct {
	g                    *Group
	segs                 [][]byte // every rank's segment, by rank
	posted, done, readTo []*atomic.Uint64
	arrive               [][shmWaitKinds]*atomic.Uint64 // by rank: counters peers add to
	sleep                []*atomic.Uint64               // by rank: what it sleeps for, 0 when awake
	bells                []bell
	slab, small          int
	spin, yield          int
	step                 uint64 // the last step this rank started
	large                uint64 // large rounds this rank has started
	srcs                 [][]byte
	got                  []bool
	// wakes counts the slow wait's looks at the counters (tests watch a
	// waiter take another look); beforeArrive, nil but in tests, runs in
	// announce before each peer's counter moves.
	wakes        atomic.Uint64
	beforeArrive func(k shmWaitKind, peer int)
}

// shmWaitKind names an arrival counter.
type shmWaitKind uint64

const (
	waitPosted shmWaitKind = iota // peers that posted: (N−1)·step once all posted step
	waitDone                      // peers whose chunk is reduced: (N−1)·large rounds
	waitRead                      // peers that finished reading: (N−1)·step
	shmWaitKinds
)

const sleepTargetMask = 1<<56 - 1

// newShmFast returns the fast path if every peer's connection is shared
// memory of one Connect, else nil.
func newShmFast(g *Group, conns []net.Conn) *shmFast {
	if g.world < 2 {
		return nil
	}
	var node *shmNode
	segs := make([][]byte, g.world)
	var first *shmConn
	for j, c := range conns {
		if j == g.rank {
			continue
		}
		sc, ok := c.(*shmConn)
		if !ok || (node != nil && sc.node != node) {
			return nil
		}
		node, first = sc.node, sc
		segs[j] = sc.peerSeg
	}
	segs[g.rank] = node.mem
	f := &shmFast{g: g, segs: segs, slab: (len(node.mem) - 2*shmPage) / 2, small: first.small,
		srcs: make([][]byte, g.world), got: make([]bool, g.world)}
	f.spin, f.yield = shmWait(first.optSpin, first.optYield, g.world, runtime.NumCPU())
	for _, s := range segs {
		f.posted = append(f.posted, u64At(s, shmPage+rankPosted))
		f.done = append(f.done, u64At(s, shmPage+rankDone))
		f.readTo = append(f.readTo, u64At(s, shmPage+rankRead))
		var a [shmWaitKinds]*atomic.Uint64
		for k := range a {
			a[k] = u64At(s, shmPage+rankArrive+64*k)
		}
		f.arrive = append(f.arrive, a)
		f.sleep = append(f.sleep, u64At(s, shmPage+rankSleep))
		f.bells = append(f.bells, bell{seq: u32At(s, shmPage+rankBell)})
	}
	return f
}

// ringWait is the byte rings' spin and yield counts from ShmOptions' Spin
// and Yield: 0 chooses 200 polls and no yield, negative is none.
func ringWait(spin, yield int) (int, int) {
	if spin == 0 {
		spin = 200
	}
	return max(spin, 0), max(yield, 0)
}

// The fast path's waits when ShmOptions leaves them to the transport (see
// shmWait).
const (
	shmSpinAlone   = 100000 // polls, about 60 µs here (0.6 ns a poll), when every rank can have a core
	shmSpinShared  = 200    // when ranks outnumber the cores: a fraction of a microsecond
	shmYieldShared = 100    // then give the core away this many times before sleeping
)

// shmWait is the fast path's spin and yield counts for ranks ranks on a
// host of cores cores, from ShmOptions' Spin and Yield (0: choose; negative:
// none). When every rank can have a core of its own, a waiter polls for tens
// of microseconds: its peers are running, and a futex wake-up costs more
// than that (vader spins for ever; this bound keeps a stopped peer from
// costing a core). When ranks outnumber the cores, the peer awaited may be
// waiting for this very core: a waiter polls briefly, then yields it a
// while before it sleeps. Measured on two cores against OpenMPI's vader:
// two ranks, 4 KiB in 1.2–1.3 µs (vader 2.3–4.1; 10–14 µs with 200 polls);
// four ranks, 4 KiB in 15–16 µs (vader 26) and 1 MiB at 5.1 GB/s busbw
// (vader 4.6–5.0; 4.0–4.5 without the yields). Training two ranks, each
// computing on one core, the long spin cost nothing measurable.
func shmWait(spin, yield, ranks, cores int) (int, int) {
	alone := ranks <= cores
	if spin == 0 {
		spin = shmSpinShared
		if alone {
			spin = shmSpinAlone
		}
	}
	if yield == 0 && !alone {
		yield = shmYieldShared
	}
	return max(spin, 0), max(yield, 0)
}

// interrupt wakes this rank's waiter so it re-checks the group's state.
func (f *shmFast) interrupt() { f.bells[f.g.rank].force() }

// announce stores v in w (this rank's word of kind k), adds one to every
// peer's counter of kind k, and rings each peer that this makes reach what
// it sleeps for.
func (f *shmFast) announce(k shmWaitKind, w *atomic.Uint64, v uint64) {
	w.Store(v)
	for q := range f.arrive {
		if q == f.g.rank {
			continue
		}
		if f.beforeArrive != nil {
			f.beforeArrive(k, q)
		}
		n := f.arrive[q][k].Add(1)
		if s := f.sleep[q].Load(); s != 0 && shmWaitKind(s>>56) == k && n >= s&sleepTargetMask &&
			f.sleep[q].CompareAndSwap(s, 0) {
			f.bells[q].force()
		}
	}
}

func (f *shmFast) slabOf(q int, step uint64) []byte {
	off := 2*shmPage + int(step%2)*f.slab
	return f.segs[q][off : off+f.slab]
}

func (f *shmFast) descOf(q int, step uint64) []byte {
	off := shmPage + rankDesc + int(step%2)*ctrlSize
	return f.segs[q][off : off+ctrlSize]
}

// lagging returns a peer whose word of kind k has not reached step (the one
// to blame for a wait) and true; or, when every peer's word has reached it,
// the next rank and false: what is awaited is then an announcement in
// flight, its word stored but this rank's counter not yet moved (announce
// stores the word first), and the announcer need not still be in the group:
// having seen every counter it waited for move, a peer may finish the
// operation and say goodbye while another's announcement is still on its way
// here.
func (f *shmFast) lagging(k shmWaitKind, step uint64) (int, bool) {
	N, r := f.g.world, f.g.rank
	words := [shmWaitKinds][]*atomic.Uint64{waitPosted: f.posted, waitDone: f.done, waitRead: f.readTo}[k]
	for i := 1; i < N; i++ {
		if q := (r + i) % N; words[q].Load() < step {
			return q, true
		}
	}
	return (r + 1) % N, false
}

// waitFor waits until this rank's counter of kind k reaches target (every
// peer's word of kind k has reached step, or for waitDone some of them),
// failing the group if it breaks, the context ends, a lagging peer closed
// its group, or the deadline passes (ErrTimeout, blaming a lagging peer as
// the links do).
func (f *shmFast) waitFor(k shmWaitKind, target, step uint64) error {
	g := f.g
	c := f.arrive[g.rank][k]
	for range f.spin {
		if c.Load() >= target {
			return nil
		}
	}
	for range f.yield {
		if c.Load() >= target {
			return nil
		}
		select {
		case <-g.dead:
			return g.failure()
		default:
		}
		schedYield()
	}
	me, sleep := f.bells[g.rank], f.sleep[g.rank]
	for {
		if c.Load() >= target {
			return nil
		}
		select {
		case <-g.dead:
			return g.failure()
		case <-g.ctxDone:
			return g.cancelled()
		default:
		}
		f.wakes.Add(1)
		// Only a peer that has not announced and said goodbye never will;
		// a goodbye from a peer that did is no failure.
		q, lags := f.lagging(k, step)
		if l := g.links[q]; lags && l.peerBye.Load() {
			if c.Load() >= target {
				return nil // the peer announced, then finished and said goodbye
			}
			return g.fail(l.lost(g.cur.op.String(), fmt.Sprintf("rank %d closed its group", q), nil))
		}
		if !time.Now().Before(g.deadline) {
			return g.timedOut(q)
		}
		s := me.seq.Load()
		publish64(sleep, uint64(k)<<56|target) // fenced before the check below
		if c.Load() >= target {
			sleep.Store(0)
			return nil
		}
		futexWait(me.seq, s, g.deadline)
		sleep.Store(0)
	}
}

// allReduce reduces data in place; the caller has begun the operation.
func (f *shmFast) allReduce(data []byte, dt DType, op ReduceOp) error {
	g := f.g
	es := dt.Size()
	count := len(data) / es
	if count == 0 {
		return nil
	}
	per := f.slab / es
	rounds := (count + per - 1) / per
	per = (count + rounds - 1) / rounds
	want := opDesc{job: g.job, gen: g.m.Generation, seq: g.cur.seq, count: uint64(count), dtype: dt, arg: g.cur.arg}
	for lo := 0; lo < count; lo += per {
		hi := min(lo+per, count)
		f.step++
		want.step, want.offset = f.step, uint64(lo)
		if err := f.round(data[lo*es:hi*es], es, op, &want); err != nil {
			return err
		}
	}
	return nil
}

// barrier is Barrier through the rank segments: one step with no data, so
// every rank waits once, on its own counter, for all its peers, instead of
// ceil(log2 N) message rounds over the rings. Its descriptor (count 0, dtype
// Uint8) fences it against an allreduce, which always has elements; the
// caller has begun the operation.
func (f *shmFast) barrier() error {
	g := f.g
	f.step++
	want := opDesc{job: g.job, gen: g.m.Generation, seq: g.cur.seq, step: f.step, dtype: Uint8, arg: g.cur.arg}
	return f.round(nil, 1, Sum, &want)
}

// round runs one step over part, at most a slab.
func (f *shmFast) round(part []byte, es int, op ReduceOp, want *opDesc) error {
	g := f.g
	N, r, step := g.world, g.rank, want.step
	peers := uint64(N - 1)
	// The slab of this parity is free once every peer has read step-2.
	if step > 2 {
		if err := f.waitFor(waitRead, peers*(step-2), step-2); err != nil {
			return err
		}
	}
	small := len(part) <= f.small
	n := len(part) / es
	lo, hi := ShardRange(n, N, r)
	lo, hi = lo*es, hi*es
	mine := f.slabOf(r, step)[:len(part)]
	if small {
		copy(mine, part)
	} else {
		// Nobody reads this rank's own chunk of its input but itself.
		copy(mine[:lo], part[:lo])
		copy(mine[hi:], part[hi:])
	}
	want.encode(f.descOf(r, step))
	f.announce(waitPosted, f.posted[r], step)
	if err := f.waitFor(waitPosted, peers*step, step); err != nil {
		return err
	}
	for q := range N {
		if q == r {
			continue
		}
		d, err := decodeOpDesc(f.descOf(q, step))
		var detail string
		var kind error
		if err != nil {
			detail, kind = err.Error(), ErrProtocol
		} else {
			detail, kind = d.check(*want)
		}
		if kind != nil {
			return g.fail(&OpError{Op: g.cur.op.String(), Seq: g.cur.seq, Rank: q, ReportedBy: r, Kind: kind,
				Detail: fmt.Sprintf("rank %d: %s", q, detail)})
		}
	}
	dt := want.dtype
	if small {
		// Everyone reduces everything, in rank order.
		for q := range N {
			f.srcs[q] = f.slabOf(q, step)[:len(part)]
		}
		reduceN(dt, op, part, nil, f.srcs)
		f.announce(waitRead, f.readTo[r], step)
		return nil
	}
	for q := range N {
		f.srcs[q] = f.slabOf(q, step)[lo:hi]
	}
	f.srcs[r] = part[lo:hi]
	reduceN(dt, op, mine[lo:hi], part[lo:hi], f.srcs)
	f.large++
	f.announce(waitDone, f.done[r], step)
	clear(f.got)
	base := peers * (f.large - 1)
	for have := uint64(0); have < peers; {
		if err := f.waitFor(waitDone, base+have+1, step); err != nil {
			return err
		}
		for k := 1; k < N; k++ {
			q := (r + k) % N
			if f.got[q] || f.done[q].Load() < step {
				continue
			}
			f.got[q] = true
			have++
			lo, hi := ShardRange(n, N, q)
			copy(part[lo*es:hi*es], f.slabOf(q, step)[lo*es:hi*es])
		}
	}
	f.announce(waitRead, f.readTo[r], step)
	return nil
}

// reduceBlock is how many bytes reduceN combines at a time: small enough
// that the partial result stays in the L1 cache while every input is added.
const reduceBlock = 8 << 10

// reduceN sets dst = srcs[0] op srcs[1] op … op srcs[N−1], combined in that
// order (so bitwise what N−1 reduceInto calls give), and copies the result
// into also when it is not nil. It works a block at a time, so each input
// is read once and dst is written once. dst must not overlap any source; also
// may be one of them (each block is read before it is overwritten).
func reduceN(dt DType, op ReduceOp, dst, also []byte, srcs [][]byte) {
	for off := 0; off < len(dst); off += reduceBlock {
		end := min(off+reduceBlock, len(dst))
		d := dst[off:end]
		copy(d, srcs[0][off:end])
		for _, s := range srcs[1:] {
			reduceInto(dt, op, d, s[off:end])
		}
		if also != nil {
			copy(also[off:end], d)
		}
	}
}

// watchContext makes a cancelled ctx wake this rank's waiter; the returned
// function stops watching, and waits for a wake-up already under way, which
// rings a doorbell in the segment: the group's Close unmaps it afterwards.
func (f *shmFast) watchContext(ctx context.Context) func() {
	if ctx.Done() == nil {
		return nil
	}
	rung := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(rung)
		f.interrupt()
	})
	return func() {
		if !stop() {
			<-rung
		}
	}
}
