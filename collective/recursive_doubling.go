package collective

// recursiveDoubling allreduces data in ceil(log2 N) rounds of whole-vector
// exchanges along a butterfly. With N not a power of two, the first 2·(N−p)
// ranks pair up first (even ranks hand their data to the odd neighbour and get
// the result back at the end), leaving p = 2^⌊log2 N⌋ ranks.
//
// Each round both partners compute mine⊕theirs; every kernel is commutative to
// the bit, so partners hold identical vectors after every round.
func (g *Group) recursiveDoubling(data []byte, dt DType, op ReduceOp) error {
	N, r := g.world, g.rank
	p := 1
	for p*2 <= N {
		p *= 2
	}
	extra := N - p
	tmp := g.scratchBuf(0, len(data))
	exchange := func(peer int) error {
		l := g.links[peer]
		if err := g.send(l, data); err != nil {
			return err
		}
		if err := g.recv(l, tmp); err != nil {
			return err
		}
		if err := g.waitRecv(l); err != nil {
			return err
		}
		if err := g.waitSent(l); err != nil { // data is read by the sender until here
			return err
		}
		reduceInto(dt, op, data, tmp)
		return nil
	}

	newRank := r - extra
	if r < 2*extra {
		if r%2 == 0 { // hand our vector to r+1, take the result back at the end
			l := g.links[r+1]
			if err := g.send(l, data); err != nil {
				return err
			}
			if err := g.waitSent(l); err != nil {
				return err
			}
			if err := g.recv(l, data); err != nil {
				return err
			}
			return g.waitRecv(l)
		}
		l := g.links[r-1]
		if err := g.recv(l, tmp); err != nil {
			return err
		}
		if err := g.waitRecv(l); err != nil {
			return err
		}
		reduceInto(dt, op, data, tmp)
		newRank = r / 2
	}
	for mask := 1; mask < p; mask <<= 1 {
		pn := newRank ^ mask
		peer := pn + extra
		if pn < extra {
			peer = 2*pn + 1
		}
		if err := exchange(peer); err != nil {
			return err
		}
	}
	if r < 2*extra {
		return g.send(g.links[r-1], data) // drained by end before data is released
	}
	return nil
}
