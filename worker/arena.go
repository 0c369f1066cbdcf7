package worker

import (
	"fmt"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/nn"
)

// gradArena holds every parameter's gradient in one buffer, followed by the
// step's statistics (statsLen values): the parameters' Grad slices point into
// it. The gradients are laid out in reverse parameter order, the order the
// backward pass finishes them, and cut into chunks at parameter boundaries,
// each closed once it holds at least a bucket's bytes; the statistics join
// the last, or are a chunk of their own when gradients travel compressed (the
// statistics must not be rounded). Each chunk is reduced in place as one
// bucket, so neither the gradients nor the statistics are ever copied to be
// reduced.
type gradArena struct {
	buf     []float32
	chunks  [][]float32 // views of buf
	bounds  []int       // chunk k is buf[bounds[k]:bounds[k+1]]
	chunkOf []int       // parameter → chunk
	params  []int       // parameters in each chunk
}

// newGradArena moves the gradients of params into an arena (keeping their
// values) and points each Grad into it; statsApart puts the statistics in a
// chunk of their own.
func newGradArena(params []*nn.Param, bucketBytes int, statsApart bool) gradArena {
	n := 0
	for _, p := range params {
		n += len(p.Grad)
	}
	a := gradArena{buf: make([]float32, n+statsLen), chunkOf: make([]int, len(params)), bounds: []int{0}}
	const es = 4 // bytes of a float32
	at, count := 0, 0
	for i := len(params) - 1; i >= 0; i-- {
		p := params[i]
		g := a.buf[at : at+len(p.Grad) : at+len(p.Grad)]
		copy(g, p.Grad)
		p.Grad = g
		at += len(g)
		a.chunkOf[i] = len(a.bounds) - 1
		count++
		if (at-a.bounds[len(a.bounds)-1])*es >= bucketBytes && i > 0 || i == 0 && statsApart && at > 0 {
			a.bounds = append(a.bounds, at)
			a.params = append(a.params, count)
			count = 0
		}
	}
	a.bounds = append(a.bounds, len(a.buf)) // the last chunk takes the statistics
	a.params = append(a.params, count)
	a.chunks = a.views(a.buf)
	return a
}

// views cuts buf (of the arena's length) into the arena's chunks.
func (a *gradArena) views(buf []float32) [][]float32 {
	out := make([][]float32, len(a.bounds)-1)
	for k := range out {
		out[k] = buf[a.bounds[k]:a.bounds[k+1]:a.bounds[k+1]]
	}
	return out
}

// grads is the gradients' part of the arena.
func (a *gradArena) grads() []float32 { return a.buf[:len(a.buf)-statsLen] }

// tail is the statistics' part of the arena.
func (a *gradArena) tail() []float32 { return a.buf[len(a.buf)-statsLen:] }

// spareArena is a buffer of the arena's layout that a late hybrid rank
// reduces (zeros and its votes) while its own arena is still being computed
// into, with a Fuser of its own issuing the same operations as the
// participants' arena Fuser.
type spareArena struct {
	buf   []float32
	fuser *collective.Fuser[float32]
}

// spare takes a spare arena from the free list or builds one.
func (t *Trainer) spare() (*spareArena, error) {
	if n := len(t.hybridFree); n > 0 {
		s := t.hybridFree[n-1]
		t.hybridFree = t.hybridFree[:n-1]
		clear(s.buf)
		return s, nil
	}
	s := &spareArena{buf: make([]float32, len(t.grads.buf))}
	var err error
	if s.fuser, err = t.newFuser(t.g, t.grads.views(s.buf)); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return s, nil
}

// dropSpares closes the spare arenas' Fusers (their group is going away).
func (t *Trainer) dropSpares() {
	for _, s := range t.hybridFree {
		s.fuser.Close()
	}
	t.hybridFree = nil
	for _, r := range t.hybridQueue {
		if r.spare != nil {
			r.spare.fuser.Close()
		}
	}
	t.hybridQueue = t.hybridQueue[:0]
}
