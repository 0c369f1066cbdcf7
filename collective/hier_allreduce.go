package collective

import "net"

// hierarchy is the layout of a group spread over several hosts with the
// same number (more than one) of ranks on each, for the hierarchical
// allreduce: reduce-scatter inside each host over shared memory, one
// allreduce ring per local shard across the hosts over TCP, allgather inside
// each host. Only the shared-memory links and one TCP link per remote host
// carry data, and each byte crosses the network once per host rather than
// once per rank.
type hierarchy struct {
	local    []int // the ranks of this host, in rank order
	localPos int   // this rank's place among them
	cross    []int // the ranks holding the same local place on every host, in host order
	crossPos int   // this host's place among them
}

// newHierarchy returns the layout if m.Hosts names at least two hosts with
// the same number, at least two, of ranks each and every same-host
// connection is shared memory (TransportAuto), else nil.
func newHierarchy(m Membership, conns []net.Conn) *hierarchy {
	if len(m.Hosts) == 0 {
		return nil
	}
	var order []string
	byHost := map[string][]int{}
	for r, h := range m.Hosts {
		if _, ok := byHost[h]; !ok {
			order = append(order, h)
		}
		byHost[h] = append(byHost[h], r)
	}
	L := len(byHost[order[0]])
	if len(order) < 2 || L < 2 {
		return nil
	}
	for _, h := range order {
		if len(byHost[h]) != L {
			return nil
		}
	}
	hz := &hierarchy{local: byHost[m.Hosts[m.Rank]]}
	for i, r := range hz.local {
		if r == m.Rank {
			hz.localPos = i
		} else if _, ok := conns[r].(*shmConn); !ok {
			return nil
		}
	}
	for i, h := range order {
		if h == m.Hosts[m.Rank] {
			hz.crossPos = i
		}
		hz.cross = append(hz.cross, byHost[h][hz.localPos])
	}
	return hz
}

// hierAllReduce reduces data in place over the hierarchy. Each local shard
// is reduced once inside the host in ring order, then across hosts by one
// ring, then copied, so every rank ends with the same bits.
func (g *Group) hierAllReduce(data []byte, dt DType, op ReduceOp) error {
	hz := g.hier
	L, H := len(hz.local), len(hz.cross)
	n := len(data) / dt.Size()
	es := dt.Size()
	local := chunking{count: n, world: L}
	if err := g.ringOn(hz.local, hz.localPos, data, dt, op, local, 0, L-1); err != nil {
		return err
	}
	if err := g.drain(); err != nil { // the next ring counts its sends from zero
		return err
	}
	lo, hi := local.bounds(hz.localPos)
	shard := data[lo*es : hi*es]
	if err := g.ringOn(hz.cross, hz.crossPos, shard, dt, op, chunking{count: hi - lo, world: H}, 0, 2*(H-1)); err != nil {
		return err
	}
	if err := g.drain(); err != nil {
		return err
	}
	return g.ringOn(hz.local, hz.localPos, data, dt, op, local, L-1, 2*(L-1))
}
