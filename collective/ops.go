package collective

import (
	"context"
	"fmt"
)

// broadcastChainBytes is where Broadcast switches from the binomial tree to
// the pipelined chain.
const broadcastChainBytes = 256 << 10

func (g *Group) checkReducible(name string, b Buffer, op ReduceOp) error {
	if !b.dt.Reducible() {
		return fmt.Errorf("collective %s: cannot reduce %s elements", name, b.dt)
	}
	if op < Sum || op > Max {
		return fmt.Errorf("collective %s: unknown reduce op %d", name, op)
	}
	return nil
}

// AllReduce combines b element-wise across all ranks, in place, with the
// group's algorithm choice. Every rank ends with the same bits.
func (g *Group) AllReduce(ctx context.Context, b Buffer, op ReduceOp) error {
	return g.AllReduceWith(ctx, b, op, AlgoAuto)
}

// AllReduceWith is AllReduce with an explicit algorithm, which the group's
// connections may replace: on shared memory of one host the single-copy
// allreduce replaces the ring and recursive doubling (float32 and float64),
// across hosts of several ranks each the hierarchical allreduce replaces the
// ring (see the package documentation). Every rank must end up running the
// same algorithm: a disagreement is an ErrMismatch. LastAlgorithm says which
// ran.
func (g *Group) AllReduceWith(ctx context.Context, b Buffer, op ReduceOp, algo Algorithm) error {
	if err := g.checkReducible("allreduce", b, op); err != nil {
		return err
	}
	algo, err := chooseAllReduce(algo, len(b.b), b.dt, g.allreducePaths(), g.opts)
	if err != nil {
		return fmt.Errorf("collective allreduce: %w", err)
	}
	if err := g.begin(ctx, opAllReduce, b.dt, b.Len(), allreduceArg(op, algo)); err != nil {
		return err
	}
	g.lastAlgo.Store(uint32(algo))
	if g.world > 1 {
		switch algo {
		case AlgoRing:
			err = g.ringSteps(b.b, b.dt, op, chunking{count: b.Len(), world: g.world}, 0, 2*(g.world-1))
		case AlgoRecursiveDoubling:
			err = g.recursiveDoubling(b.b, b.dt, op)
		case AlgoSingleCopy:
			err = g.fast.allReduce(b.b, b.dt, op)
		case AlgoHierarchical:
			err = g.hierAllReduce(b.b, b.dt, op)
		}
	}
	if err = g.end(err); err == nil && op == Avg {
		scaleDiv(b.dt, b.b, g.world)
	}
	return err
}

// LastAlgorithm is the algorithm the group's latest AllReduce ran, or began
// to run if it failed; AlgoAuto before the first. In a world of one it is
// the algorithm chosen, which had nothing to move.
func (g *Group) LastAlgorithm() Algorithm { return Algorithm(g.lastAlgo.Load()) }

// ReduceScatter combines in element-wise across ranks and leaves this rank's
// share, elements ShardRange(in.Len(), Size(), Rank()), in out. in is not
// modified.
func (g *Group) ReduceScatter(ctx context.Context, in, out Buffer, op ReduceOp) error {
	if err := g.checkReducible("reduce-scatter", in, op); err != nil {
		return err
	}
	return g.reduceScatter(ctx, in, out, op, chunking{count: in.Len(), world: g.world})
}

// reduceScatter runs a reduce-scatter whose shares are ch's chunks:
// rank r keeps chunk r.
func (g *Group) reduceScatter(ctx context.Context, in, out Buffer, op ReduceOp, ch chunking) error {
	lo, hi := ch.bounds(g.rank)
	if out.dt != in.dt || out.Len() != hi-lo {
		return fmt.Errorf("collective reduce-scatter: output of %d %s elements, want %d %s (elements [%d,%d) of %d)",
			out.Len(), out.dt, hi-lo, in.dt, lo, hi, in.Len())
	}
	if err := g.begin(ctx, opReduceScatter, in.dt, in.Len(), allreduceArg(op, AlgoRing)); err != nil {
		return err
	}
	es := in.dt.Size()
	work := g.workBuf(len(in.b))
	copy(work, in.b)
	var err error
	if g.world > 1 {
		err = g.ringSteps(work, in.dt, op, ch, 0, g.world-1)
	}
	if err = g.end(err); err == nil {
		copy(out.b, work[lo*es:hi*es])
		if op == Avg {
			scaleDiv(out.dt, out.b, g.world)
		}
	}
	return err
}

// ReduceScatterRanges is ReduceScatter with shares of any sizes: in is
// combined element-wise across ranks and rank r keeps elements [cuts[r],
// cuts[r+1]) of the result, in out. cuts has Size()+1 non-decreasing
// entries from 0 to in.Len(), the same on every rank. in is not modified.
func (g *Group) ReduceScatterRanges(ctx context.Context, in Buffer, cuts []int, out Buffer, op ReduceOp) error {
	if err := g.checkReducible("reduce-scatter", in, op); err != nil {
		return err
	}
	if len(cuts) != g.world+1 || cuts[0] != 0 || cuts[g.world] != in.Len() {
		return fmt.Errorf("collective reduce-scatter: cuts %v: want %d entries from 0 to %d", cuts, g.world+1, in.Len())
	}
	for i := range g.world {
		if cuts[i] > cuts[i+1] {
			return fmt.Errorf("collective reduce-scatter: cuts %v decrease", cuts)
		}
	}
	return g.reduceScatter(ctx, in, out, op, chunking{count: in.Len(), world: g.world, cuts: cuts})
}

// AllGather concatenates every rank's in, in rank order, into out, whose
// length must be Size() × in.Len().
func (g *Group) AllGather(ctx context.Context, in, out Buffer) error {
	m := in.Len()
	if out.dt != in.dt || out.Len() != m*g.world {
		return fmt.Errorf("collective allgather: output of %d %s elements, want %d × %d %s", out.Len(), out.dt, g.world, m, in.dt)
	}
	if err := g.begin(ctx, opAllGather, in.dt, m, 0); err != nil {
		return err
	}
	es := in.dt.Size()
	copy(out.b[g.rank*m*es:], in.b)
	var err error
	if g.world > 1 {
		err = g.ringSteps(out.b, in.dt, 0, chunking{per: m, world: g.world}, g.world-1, 2*(g.world-1))
	}
	return g.end(err)
}

// AllGatherInPlace fills b on every rank from its owners: each rank
// contributes elements ShardRange(b.Len(), Size(), Rank()) of its own b, and
// when it returns every rank's b holds every rank's share. Unlike AllGather the
// shares may differ in length by one element, so any length can be gathered.
func (g *Group) AllGatherInPlace(ctx context.Context, b Buffer) error {
	if err := g.begin(ctx, opAllGather, b.dt, b.Len(), 1); err != nil {
		return err
	}
	var err error
	if g.world > 1 {
		err = g.ringSteps(b.b, b.dt, 0, chunking{count: b.Len(), world: g.world}, g.world-1, 2*(g.world-1))
	}
	return g.end(err)
}

// AllGatherRanges is AllGatherInPlace with shares of any sizes: rank r
// contributes elements [cuts[r], cuts[r+1]) of b. cuts has Size()+1
// non-decreasing entries from 0 to b.Len(), the same on every rank.
func (g *Group) AllGatherRanges(ctx context.Context, b Buffer, cuts []int) error {
	if len(cuts) != g.world+1 || cuts[0] != 0 || cuts[g.world] != b.Len() {
		return fmt.Errorf("collective allgather: %d cuts from %v to %v for %d ranks and %d elements", len(cuts), cuts[0], cuts[len(cuts)-1], g.world, b.Len())
	}
	for i := range g.world {
		if cuts[i] > cuts[i+1] {
			return fmt.Errorf("collective allgather: cuts %v decrease", cuts)
		}
	}
	if err := g.begin(ctx, opAllGather, b.dt, b.Len(), 2); err != nil {
		return err
	}
	var err error
	if g.world > 1 {
		err = g.ringSteps(b.b, b.dt, 0, chunking{count: b.Len(), world: g.world, cuts: cuts}, g.world-1, 2*(g.world-1))
	}
	return g.end(err)
}

// Broadcast copies root's b into b on every other rank.
func (g *Group) Broadcast(ctx context.Context, b Buffer, root int) error {
	if root < 0 || root >= g.world {
		return fmt.Errorf("collective broadcast: root %d outside world of %d", root, g.world)
	}
	if err := g.begin(ctx, opBroadcast, b.dt, b.Len(), uint32(root)); err != nil {
		return err
	}
	var err error
	if g.world > 1 {
		if len(b.b) <= broadcastChainBytes {
			err = g.binomialBroadcast(b.b, root)
		} else {
			err = g.chainBroadcast(b.b, root)
		}
	}
	return g.end(err)
}

// Barrier returns once every rank has entered it.
func (g *Group) Barrier(ctx context.Context) error {
	if err := g.begin(ctx, opBarrier, Uint8, 0, 0); err != nil {
		return err
	}
	var err error
	switch {
	case g.world > 1 && g.fast != nil:
		err = g.fast.barrier()
	case g.world > 1:
		err = g.dissemination()
	}
	return g.end(err)
}

// Send delivers b to rank dst, which must call Recv with a buffer of the same
// type and length. Point-to-point messages between a pair arrive in the order
// sent and do not take part in the collectives' numbering. Send returns when b
// is handed to the transport: a large message to a peer that is not receiving
// blocks, so two ranks exchanging large messages should use SendRecv.
func (g *Group) Send(ctx context.Context, dst int, b Buffer) error {
	return g.sendRecv(ctx, dst, b, -1, Buffer{})
}

// Recv fills b with the next message from rank src.
func (g *Group) Recv(ctx context.Context, src int, b Buffer) error {
	return g.sendRecv(ctx, -1, Buffer{}, src, b)
}

// SendRecv sends out to dst and receives in from src at the same time.
func (g *Group) SendRecv(ctx context.Context, dst int, out Buffer, src int, in Buffer) error {
	return g.sendRecv(ctx, dst, out, src, in)
}

func (g *Group) sendRecv(ctx context.Context, dst int, out Buffer, src int, in Buffer) error {
	for _, p := range []int{dst, src} {
		if p != -1 && (p < 0 || p >= g.world || p == g.rank) {
			return fmt.Errorf("collective send/recv: peer %d is not another rank of a world of %d", p, g.world)
		}
	}
	if err := g.begin(ctx, opSendRecv, 0, 0, 0); err != nil {
		return err
	}
	seg := max(g.opts.SegmentBytes, (max(len(out.b), len(in.b))+maxQueued-1)/maxQueued)
	var err error
	if dst >= 0 {
		l := g.links[dst]
		g.cur.dtype, g.cur.count = out.dt, uint64(out.Len())
		for a := 0; err == nil && (a < len(out.b) || a == 0); a += seg {
			err = g.send(l, out.b[a:min(a+seg, len(out.b))])
		}
		l.p2pSendSeq++
	}
	if src >= 0 && err == nil {
		l := g.links[src]
		g.cur.dtype, g.cur.count = in.dt, uint64(in.Len())
		for a := 0; err == nil && (a < len(in.b) || a == 0); a += seg {
			err = g.recv(l, in.b[a:min(a+seg, len(in.b))])
		}
		l.p2pRecvSeq++
	}
	return g.end(err)
}
