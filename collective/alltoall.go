package collective

import (
	"context"
	"fmt"
	"unsafe"
)

// AllToAll sends each rank its own part of in and receives every rank's
// part for this one into out: elements [sendCuts[r], sendCuts[r+1]) of in
// go to rank r, and rank r's part for this rank lands in elements
// [recvCuts[r], recvCuts[r+1]) of out. Parts may have any sizes, zero
// included, as long as each pair agrees: what rank a sends to rank b is as
// long as what b expects from a (a pair that disagrees fails the group with
// ErrMismatch, naming the peer). This rank's own part is copied locally.
//
// The exchange is pairwise: in step k = 1..Size()-1 each rank sends to
// rank+k and receives from rank−k, every transfer queued at once on its
// link, so that no pair waits on another's turn. It runs over every
// transport the group's links do (TCP, shared memory, in-process), fenced
// by job, generation and operation sequence like every other operation,
// and a lost peer, a timeout or an abort fails it as they fail the rest.
func (g *Group) AllToAll(ctx context.Context, in Buffer, sendCuts []int, out Buffer, recvCuts []int) error {
	if in.dt != out.dt {
		return fmt.Errorf("collective all-to-all: input of %s elements, output of %s", in.dt, out.dt)
	}
	if overlap(in.b, out.b) {
		return fmt.Errorf("collective all-to-all: the input and output buffers overlap (parts are sent from one while received into the other)")
	}
	if err := checkCuts("input", sendCuts, g.world, in.Len()); err != nil {
		return err
	}
	if err := checkCuts("output", recvCuts, g.world, out.Len()); err != nil {
		return err
	}
	me := g.rank
	if own, want := sendCuts[me+1]-sendCuts[me], recvCuts[me+1]-recvCuts[me]; own != want {
		return fmt.Errorf("collective all-to-all: rank %d sends itself %d elements and expects %d", me, own, want)
	}
	if err := g.begin(ctx, opAllToAll, in.dt, 0, 0); err != nil {
		return err
	}
	es := in.dt.Size()
	copy(out.b[recvCuts[me]*es:recvCuts[me+1]*es], in.b[sendCuts[me]*es:sendCuts[me+1]*es])
	var err error
	for k := 1; k < g.world && err == nil; k++ {
		to, from := (me+k)%g.world, (me-k+g.world)%g.world
		part := in.b[sendCuts[to]*es : sendCuts[to+1]*es]
		g.cur.count = uint64(sendCuts[to+1] - sendCuts[to])
		for a, seg := 0, segmentOf(g.opts.SegmentBytes, len(part)); err == nil && (a < len(part) || a == 0); a += seg {
			err = g.send(g.links[to], part[a:min(a+seg, len(part))])
		}
		if err != nil {
			break
		}
		into := out.b[recvCuts[from]*es : recvCuts[from+1]*es]
		g.cur.count = uint64(recvCuts[from+1] - recvCuts[from])
		for a, seg := 0, segmentOf(g.opts.SegmentBytes, len(into)); err == nil && (a < len(into) || a == 0); a += seg {
			err = g.recv(g.links[from], into[a:min(a+seg, len(into))])
		}
	}
	return g.end(err)
}

// segmentOf is the frame payload a part of n bytes is cut into: the
// group's segment, or larger so that no link queues more than maxQueued
// frames. Both ends of a pair compute it from the same n.
func segmentOf(segment, n int) int { return max(segment, (n+maxQueued-1)/maxQueued) }

// checkCuts checks that cuts split n elements into world consecutive
// parts.
func checkCuts(what string, cuts []int, world, n int) error {
	if len(cuts) != world+1 || cuts[0] != 0 || cuts[world] != n {
		return fmt.Errorf("collective all-to-all: %s cuts %v: want %d entries from 0 to %d", what, cuts, world+1, n)
	}
	for r := range world {
		if cuts[r] > cuts[r+1] {
			return fmt.Errorf("collective all-to-all: %s cuts %v decrease at rank %d", what, cuts, r)
		}
	}
	return nil
}

// overlap reports whether a and b share memory.
func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}
