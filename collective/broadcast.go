package collective

// binomialBroadcast sends data from root down a binomial tree: ceil(log2 N)
// rounds, each rank receiving once. Best for small messages.
func (g *Group) binomialBroadcast(data []byte, root int) error {
	N := g.world
	vr := (g.rank - root + N) % N
	mask := 1
	for mask < N {
		if vr&mask != 0 {
			l := g.links[(vr-mask+root)%N]
			if err := g.recv(l, data); err != nil {
				return err
			}
			if err := g.waitRecv(l); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < N {
			if err := g.send(g.links[(vr+mask+root)%N], data); err != nil {
				return err
			}
		}
	}
	return nil
}

// chainBroadcast pipelines data segment by segment along the ring starting at
// root: every rank forwards a segment as soon as it has it, so the time is
// about (segments + N − 2) segment transfers. Best for large messages.
func (g *Group) chainBroadcast(data []byte, root int) error {
	N := g.world
	vr := (g.rank - root + N) % N
	seg := max(g.opts.SegmentBytes, (len(data)+maxQueued-1)/maxQueued) // bytes: dtype-agnostic
	n := nsegs(len(data), seg)
	next, prev := g.links[(g.rank+1)%N], g.links[(g.rank+N-1)%N]
	span := func(k int) (int, int) {
		a := min(k*seg, len(data))
		return a, min(a+seg, len(data))
	}
	posted := 0
	for k := range n {
		a, b := span(k)
		if vr > 0 {
			for ; posted < n && posted < k+2; posted++ {
				pa, pb := span(posted)
				if err := g.recv(prev, data[pa:pb]); err != nil {
					return err
				}
			}
			if err := g.waitRecv(prev); err != nil {
				return err
			}
		}
		if vr < N-1 {
			if err := g.send(next, data[a:b]); err != nil {
				return err
			}
		}
	}
	return nil
}
