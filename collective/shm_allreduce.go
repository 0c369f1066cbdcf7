package collective

import (
	"context"
	"fmt"
	"net"
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
//   - larger rounds: rank c reduces chunk c of the round out of every slab,
//     in place in its own slab, announces it, and every rank copies each
//     chunk from its owner (reduce-scatter, then allgather). Each chunk is
//     reduced once, by its owner, so every rank gets the same bits.
//
// A rank then announces it has finished reading the step. Two slabs per rank,
// used by step parity, let a rank copy in the next round while its peers
// still read the last one. Every slab carries a descriptor (job, generation,
// operation sequence, step, count, dtype, reduction) that readers check.
//
// Waits spin for a bounded number of polls, then sleep on the rank's own
// futex doorbell, which peers ring when they advance, and which a failure of
// the group (a peer's death seen by its link, an abort, Close), a cancelled
// context or the operation's deadline also end.
type shmFast struct {
	g                    *Group
	segs                 [][]byte // every rank's segment, by rank
	posted, done, readTo []*atomic.Uint64
	bells                []bell
	slab, small          int
	spin, yield          int
	step                 uint64 // the last step this rank started
}

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
	f := &shmFast{g: g, segs: segs, slab: (len(node.mem) - 2*shmPage) / 2, small: first.small, spin: first.spin, yield: first.yield}
	for _, s := range segs {
		f.posted = append(f.posted, u64At(s, shmPage+rankPosted))
		f.done = append(f.done, u64At(s, shmPage+rankDone))
		f.readTo = append(f.readTo, u64At(s, shmPage+rankRead))
		f.bells = append(f.bells, bell{seq: u32At(s, shmPage+rankBell), waiting: u32At(s, shmPage+rankWaiting)})
	}
	return f
}

// handles reports whether the fast path reduces dt; other dtypes take the
// links.
func (f *shmFast) handles(dt DType) bool { return dt == Float32 || dt == Float64 }

// interrupt wakes this rank's waiter so it re-checks the group's state.
func (f *shmFast) interrupt() { f.bells[f.g.rank].force() }

// announce stores v in w (one of this rank's words) and rings every peer
// that sleeps.
func (f *shmFast) announce(w *atomic.Uint64, v uint64) {
	w.Store(v)
	for q, b := range f.bells {
		if q != f.g.rank {
			b.ring()
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

// waitFor waits until rank q's word w reaches target, failing the group if
// it breaks, the context ends, q closed its group, or the deadline passes
// (ErrTimeout, blaming the silent peer as the links do).
func (f *shmFast) waitFor(q int, w *atomic.Uint64, target uint64) error {
	for range f.spin {
		if w.Load() >= target {
			return nil
		}
	}
	g := f.g
	for range f.yield {
		if w.Load() >= target {
			return nil
		}
		select {
		case <-g.dead:
			return g.failure()
		default:
		}
		schedYield()
	}
	me := f.bells[g.rank]
	for {
		if w.Load() >= target {
			return nil
		}
		select {
		case <-g.dead:
			return g.failure()
		case <-g.ctxDone:
			return g.cancelled()
		default:
		}
		if l := g.links[q]; l.peerBye.Load() {
			return g.fail(l.lost(g.cur.op.String(), fmt.Sprintf("rank %d closed its group", q), nil))
		}
		if !time.Now().Before(g.deadline) {
			return g.timedOut(q)
		}
		s := me.seq.Load()
		me.waiting.Store(1)
		if w.Load() >= target {
			me.waiting.Store(0)
			return nil
		}
		futexWait(me.seq, s, g.deadline)
		me.waiting.Store(0)
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

// round runs one step over part, at most a slab.
func (f *shmFast) round(part []byte, es int, op ReduceOp, want *opDesc) error {
	g := f.g
	N, r, step := g.world, g.rank, want.step
	// The slab of this parity is free once every peer has read step-2.
	if step > 2 {
		for q := range N {
			if q != r {
				if err := f.waitFor(q, f.readTo[q], step-2); err != nil {
					return err
				}
			}
		}
	}
	mine := f.slabOf(r, step)[:len(part)]
	copy(mine, part)
	want.encode(f.descOf(r, step))
	f.announce(f.posted[r], step)
	for q := range N {
		if q == r {
			continue
		}
		if err := f.waitFor(q, f.posted[q], step); err != nil {
			return err
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
	if len(part) <= f.small {
		// Everyone reduces everything, in rank order.
		if r != 0 {
			copy(part, f.slabOf(0, step)[:len(part)])
		}
		for q := 1; q < N; q++ {
			reduceInto(dt, op, part, f.slabOf(q, step)[:len(part)])
		}
		f.announce(f.readTo[r], step)
		return nil
	}
	n := len(part) / es
	lo, hi := ShardRange(n, N, r)
	own := mine[lo*es : hi*es]
	for k := 1; k < N; k++ {
		q := (r + k) % N
		reduceInto(dt, op, own, f.slabOf(q, step)[lo*es:hi*es])
	}
	f.announce(f.done[r], step)
	copy(part[lo*es:hi*es], own)
	for k := 1; k < N; k++ {
		q := (r + k) % N
		if err := f.waitFor(q, f.done[q], step); err != nil {
			return err
		}
		lo, hi := ShardRange(n, N, q)
		copy(part[lo*es:hi*es], f.slabOf(q, step)[lo*es:hi*es])
	}
	f.announce(f.readTo[r], step)
	return nil
}

// watchContext makes a cancelled ctx wake this rank's waiter; the returned
// function stops watching.
func (f *shmFast) watchContext(ctx context.Context) func() bool {
	if ctx.Done() == nil {
		return nil
	}
	return context.AfterFunc(ctx, f.interrupt)
}
