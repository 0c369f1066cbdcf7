package collective

// chunking splits a tensor of count elements into world chunks: chunk i is
// [i*count/world, (i+1)*count/world), or [i*per, (i+1)*per) when per > 0, or
// [cuts[i], cuts[i+1]) when cuts is set.
type chunking struct {
	count, world, per int
	cuts              []int
}

func (c chunking) bounds(i int) (lo, hi int) {
	if c.cuts != nil {
		return c.cuts[i], c.cuts[i+1]
	}
	if c.per > 0 {
		return i * c.per, (i + 1) * c.per
	}
	return i * c.count / c.world, (i + 1) * c.count / c.world
}

func (c chunking) maxLen() int {
	if c.cuts != nil {
		m := 0
		for i := range c.world {
			m = max(m, c.cuts[i+1]-c.cuts[i])
		}
		return m
	}
	if c.per > 0 {
		return c.per
	}
	return (c.count + c.world - 1) / c.world
}

// ShardRange is the element range [lo, hi) of a tensor of n elements that rank
// owns after ReduceScatter in a group of world ranks.
func ShardRange(n, world, rank int) (lo, hi int) {
	return chunking{count: n, world: world}.bounds(rank)
}

// segElems is the ring's pipelining unit in elements: Options.SegmentBytes,
// raised when needed so that one operation queues at most maxQueued frames
// (half of that per ring when a hierarchical allreduce runs two rings over
// one link).
func (g *Group) segElems(es int, ck chunking) int {
	seg := g.opts.SegmentBytes / es
	perChunk := maxQueued / (4 * g.world)
	if need := (ck.maxLen() + perChunk - 1) / perChunk; need > seg {
		seg = need
	}
	return max(seg, 1)
}

func nsegs(n, seg int) int { return max(1, (n+seg-1)/seg) }

// ringSteps runs steps [from, to) of the pipelined ring over data. At step s
// this rank sends chunk (r-s-1) mod N to its right neighbour and receives
// chunk (r-s-2) mod N from its left, segment by segment: steps before N-1
// reduce what arrives into data (the reduce-scatter phase), later ones store it
// in place (the allgather phase). Each segment is forwarded as soon as it is
// done, and the next segment is already being received while one is reduced,
// so the link is never idle waiting for arithmetic.
//
// Every chunk is reduced by walking the ring in one fixed order and then copied
// verbatim, so all ranks end with the same bits.
func (g *Group) ringSteps(data []byte, dt DType, op ReduceOp, ck chunking, from, to int) error {
	return g.ringOn(nil, g.rank, data, dt, op, ck, from, to)
}

// ringOn runs ring steps over a sub-ring: members lists its ranks in ring
// order (nil: every rank of the group), pos is this rank's place in it, and
// ck splits data into len(members) chunks.
func (g *Group) ringOn(members []int, pos int, data []byte, dt DType, op ReduceOp, ck chunking, from, to int) error {
	N, r, es := g.world, pos, dt.Size()
	var right, left *link
	if members == nil {
		right, left = g.links[(r+1)%N], g.links[(r+N-1)%N]
	} else {
		N = len(members)
		right, left = g.links[members[(r+1)%N]], g.links[members[(r+N-1)%N]]
	}
	seg := g.segElems(es, ck)
	chunkAt := func(s int) int { return ((r-s-1)%N + N) % N } // sent at step s, received at s-1
	span := func(c, k int) (int, int) {
		lo, hi := ck.bounds(c)
		a := min(lo+k*seg, hi)
		return a * es, min(a+seg, hi) * es
	}
	if cap(g.ords) < to-from {
		g.ords = make([]int, to-from)
	}
	ords := g.ords[:to-from] // ordinal of the first send of each step
	posted, written := 0, 0

	c0 := chunkAt(from)
	lo, hi := ck.bounds(c0)
	ords[0] = 0
	for k := range nsegs(hi-lo, seg) {
		a, b := span(c0, k)
		if err := g.send(right, data[a:b]); err != nil {
			return err
		}
		posted++
	}

	// Receive cursor: frames are posted up to two ahead of the one processed.
	ps, pk, pf := from, 0, 0 // next frame to post: step, segment, running index
	postNext := func() error {
		c := chunkAt(ps + 1)
		a, b := span(c, pk)
		var dst []byte
		if ps < N-1 {
			dst = g.scratchBuf(pf%2, b-a)
		} else {
			// In place: wait until the send that read this region (the same chunk
			// at step ps+1-N) is on the wire.
			if x := ps + 1 - N; x >= from {
				for need := ords[x-from] + pk + 1; written < need; written++ {
					if err := g.waitSent(right); err != nil {
						return err
					}
				}
			}
			dst = data[a:b]
		}
		if err := g.recv(left, dst); err != nil {
			return err
		}
		pf++
		lo, hi := ck.bounds(c)
		if pk++; pk == nsegs(hi-lo, seg) {
			ps, pk = ps+1, 0
		}
		return nil
	}
	f := 0
	for s := from; s < to; s++ {
		c := chunkAt(s + 1)
		lo, hi := ck.bounds(c)
		n := nsegs(hi-lo, seg)
		for k := range n {
			for ps < to && pf < f+2 {
				if err := postNext(); err != nil {
					return err
				}
			}
			if err := g.waitRecv(left); err != nil {
				return err
			}
			a, b := span(c, k)
			if s < N-1 {
				reduceInto(dt, op, data[a:b], g.scratch[f%2][:b-a])
			}
			f++
			if s+1 < to {
				if k == 0 {
					ords[s+1-from] = posted
				}
				if err := g.send(right, data[a:b]); err != nil {
					return err
				}
				posted++
			}
		}
	}
	return nil
}
