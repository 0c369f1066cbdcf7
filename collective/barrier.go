package collective

// dissemination is the barrier: in round k every rank signals rank r+2^k and
// waits for rank r−2^k, so after ceil(log2 N) rounds each rank has heard,
// transitively, from all.
func (g *Group) dissemination() error {
	N, r := g.world, g.rank
	for d := 1; d < N; d <<= 1 {
		to, from := g.links[(r+d)%N], g.links[(r-d+N)%N]
		if err := g.send(to, nil); err != nil {
			return err
		}
		if err := g.recv(from, nil); err != nil {
			return err
		}
		if err := g.waitRecv(from); err != nil {
			return err
		}
	}
	return nil
}
