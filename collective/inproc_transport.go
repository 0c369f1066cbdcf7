package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// InprocNetwork connects ranks living in one process through buffered
// in-memory pipes that behave like sockets (bounded buffers, deadlines,
// half-close), so the algorithms run unchanged without the kernel (unit tests,
// single-process runs).
type InprocNetwork struct {
	mu    sync.Mutex
	slots map[connKey]chan net.Conn
}

// NewInprocNetwork returns an empty network; every rank of a group must
// Connect through the same one.
func NewInprocNetwork() *InprocNetwork {
	return &InprocNetwork{slots: map[connKey]chan net.Conn{}}
}

func (n *InprocNetwork) slot(k connKey) chan net.Conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch, ok := n.slots[k]
	if !ok {
		ch = make(chan net.Conn, 1)
		n.slots[k] = ch
	}
	return ch
}

func (n *InprocNetwork) forget(k connKey) {
	n.mu.Lock()
	delete(n.slots, k)
	n.mu.Unlock()
}

// Connect implements Transport.
func (n *InprocNetwork) Connect(ctx context.Context, m Membership) ([]net.Conn, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	conns := make([]net.Conn, m.World())
	for j := range m.Rank {
		a, b := bufferedPipe(fmt.Sprintf("inproc-%d", m.Rank), fmt.Sprintf("inproc-%d", j))
		conns[j] = a
		n.slot(connKey{m.Job, m.Generation, m.Rank, j}) <- b
	}
	for j := m.Rank + 1; j < m.World(); j++ {
		k := connKey{m.Job, m.Generation, j, m.Rank}
		select {
		case c := <-n.slot(k):
			n.forget(k)
			conns[j] = c
		case <-ctx.Done():
			closeAll(conns)
			return nil, &OpError{Op: "connect", Rank: j, ReportedBy: m.Rank, Kind: ErrTimeout,
				Detail: fmt.Sprintf("rank %d did not connect", j), Err: ctx.Err()}
		}
	}
	return conns, nil
}

// InprocGroups joins n ranks of job over a fresh in-process network and
// returns their groups, rank order. It is for tests and single-process
// simulations of a job.
func InprocGroups(ctx context.Context, n int, job string, gen uint64, opts Options) ([]*Group, error) {
	network := NewInprocNetwork()
	peers := make([]string, n)
	trs := make([]Transport, n)
	for i := range peers {
		peers[i], trs[i] = fmt.Sprintf("inproc-%d", i), network
	}
	return JoinAll(ctx, trs, Membership{Job: job, Generation: gen, Peers: peers}, opts)
}

// JoinAll joins every rank of m at once, rank r over trs[r] (m.Rank is
// ignored), as the ranks of one job in one process (tests, benchmarks,
// simulations), and returns their groups in rank order; if any rank fails,
// the groups that formed are closed and the errors joined.
func JoinAll(ctx context.Context, trs []Transport, m Membership, opts Options) ([]*Group, error) {
	groups := make([]*Group, len(trs))
	errs := make([]error, len(trs))
	var wg sync.WaitGroup
	for r := range trs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mr := m
			mr.Rank = r
			groups[r], errs[r] = Join(ctx, trs[r], mr, opts)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, g := range groups {
			if g != nil {
				g.Close()
			}
		}
		return nil, err
	}
	return groups, nil
}

// CloseGroups closes groups concurrently, as the ranks of a job would: a
// healthy Close waits for the peers to close too.
func CloseGroups(groups []*Group) {
	var wg sync.WaitGroup
	for _, g := range groups {
		if g != nil {
			wg.Add(1)
			go func() { defer wg.Done(); g.Close() }()
		}
	}
	wg.Wait()
}
