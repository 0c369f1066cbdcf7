package collective

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// failedOpBuffers are one rank's buffers for an operation: what it only
// reads (which a failure must leave as they were) and what it writes
// (unspecified after a failure, but never touched once it has returned).
type failedOpBuffers struct {
	read, written [][]byte
}

// TestFailedOperationBuffers: an operation that fails — its deadline
// passing, its context cancelled, a peer aborting (as the elastic agent
// aborts a group on a generation change), a peer closing its group —
// returns only once nothing of the group uses the caller's buffers any
// more. Ranks 0 and 1 enter the operation, rank 2 never does; once a frame
// of theirs waits parked at rank 2 (they are inside), the failure strikes.
// Then: the buffers the operation only reads are bitwise as they were;
// the buffers it writes, overwritten by the test with a sentinel after the
// return, still hold it after rank 2 has sent everything it would have
// (running the operation itself, where the failure left it able to) and
// every group is closed. That the written buffers' contents after a
// failure are unspecified is the package's documented promise (doc.go).
func TestFailedOperationBuffers(t *testing.T) {
	const n = 3000 // float32 elements: several segments of a 4 KiB ring
	ops := []struct {
		name string
		// bufs makes rank r's buffers; run runs the operation on them.
		bufs func(r int, rng *rand.Rand) failedOpBuffers
		run  func(ctx context.Context, g *Group, b failedOpBuffers) error
	}{
		{"allreduce-ring", func(r int, rng *rand.Rand) failedOpBuffers {
			return failedOpBuffers{written: [][]byte{randomBytes(rng, 4*n)}}
		}, func(ctx context.Context, g *Group, b failedOpBuffers) error {
			return g.AllReduceWith(ctx, Float32s(f32s(b.written[0])), Sum, AlgoRing)
		}},
		{"allreduce-rd", func(r int, rng *rand.Rand) failedOpBuffers {
			return failedOpBuffers{written: [][]byte{randomBytes(rng, 4*n)}}
		}, func(ctx context.Context, g *Group, b failedOpBuffers) error {
			return g.AllReduceWith(ctx, Float32s(f32s(b.written[0])), Sum, AlgoRecursiveDoubling)
		}},
		{"reduce-scatter", func(r int, rng *rand.Rand) failedOpBuffers {
			lo, hi := ShardRange(n, 3, r)
			return failedOpBuffers{read: [][]byte{randomBytes(rng, 4*n)}, written: [][]byte{randomBytes(rng, 4*(hi-lo))}}
		}, func(ctx context.Context, g *Group, b failedOpBuffers) error {
			return g.ReduceScatter(ctx, Float32s(f32s(b.read[0])), Float32s(f32s(b.written[0])), Sum)
		}},
		{"allgather", func(r int, rng *rand.Rand) failedOpBuffers {
			return failedOpBuffers{read: [][]byte{randomBytes(rng, 4*n)}, written: [][]byte{randomBytes(rng, 3*4*n)}}
		}, func(ctx context.Context, g *Group, b failedOpBuffers) error {
			return g.AllGather(ctx, Float32s(f32s(b.read[0])), Float32s(f32s(b.written[0])))
		}},
		// 4 MiB, past the in-process pipes' 1 MiB: the chain from rank 1
		// stalls at rank 2, so the root waits inside too.
		{"broadcast-chain-from-1", func(r int, rng *rand.Rand) failedOpBuffers {
			if r == 1 {
				return failedOpBuffers{read: [][]byte{randomBytes(rng, 4<<20)}}
			}
			return failedOpBuffers{written: [][]byte{randomBytes(rng, 4<<20)}}
		}, func(ctx context.Context, g *Group, b failedOpBuffers) error {
			buf := append(b.read, b.written...)[0]
			return g.Broadcast(ctx, Float32s(f32s(buf)), 1)
		}},
	}
	kinds := []struct {
		name string
		want error
		// inside strikes once ranks 0 and 1 are inside the operation;
		// cancel cancels rank 0's context.
		inside func(groups []*Group, cancel context.CancelFunc)
		// lateTraffic: rank 2 can still run the operation afterwards.
		lateTraffic bool
		deadline    time.Duration // of ranks 0 and 1's operation
	}{
		{"deadline", ErrTimeout, nil, true, time.Second},
		{"cancelled", ErrAborted, func(_ []*Group, cancel context.CancelFunc) { cancel() }, true, time.Minute},
		{"peer-aborts", ErrAborted, func(groups []*Group, _ context.CancelFunc) { groups[2].Abort("generation changed") }, false, time.Minute},
		{"peer-closes", ErrPeerLost, func(groups []*Group, _ context.CancelFunc) { go groups[2].Close() }, false, time.Minute},
	}
	for _, op := range ops {
		for _, kind := range kinds {
			t.Run(op.name+"/"+kind.name, func(t *testing.T) {
				groups := inprocGroups(t, 3, 1, Options{Timeout: time.Minute, SegmentBytes: 4096})
				rng := rand.New(rand.NewPCG(uint64(len(op.name)), uint64(len(kind.name))))
				bufs := make([]failedOpBuffers, 3)
				var before [][]byte // ranks 0 and 1's read-only buffers, copied
				for r := range bufs {
					bufs[r] = op.bufs(r, rng)
					if r < 2 {
						for _, b := range bufs[r].read {
							before = append(before, bytes.Clone(b))
						}
					}
				}
				ctx0, cancel0 := context.WithTimeout(context.Background(), kind.deadline)
				defer cancel0()
				ctx1, cancel1 := context.WithTimeout(context.Background(), kind.deadline)
				defer cancel1()
				type result struct {
					rank int
					err  error
				}
				errs := make(chan result, 2)
				go func() { errs <- result{0, op.run(ctx0, groups[0], bufs[0])} }()
				go func() { errs <- result{1, op.run(ctx1, groups[1], bufs[1])} }()
				if kind.inside != nil {
					waitUntil(t, 10*time.Second, "a frame of rank 0 or 1 parked at rank 2 (they are inside the operation)", func() bool {
						return groups[2].links[0].parked.Load() || groups[2].links[1].parked.Load()
					})
					kind.inside(groups, cancel0)
				}
				for range 2 {
					select {
					case res := <-errs:
						// A rank that only sends (the broadcast's root) may finish
						// before the failure: a closing peer drains what it was sent.
						if res.err == nil && len(bufs[res.rank].written) == 0 {
							continue
						}
						if !errors.Is(res.err, kind.want) && !errors.Is(res.err, ErrAborted) {
							t.Fatalf("rank %d's failed operation returned %v, want %v (or the relayed ErrAborted)", res.rank, res.err, kind.want)
						}
					case <-time.After(30 * time.Second):
						t.Fatal("ranks 0 and 1's operation did not fail within 30s")
					}
				}
				var after [][]byte
				for r := range 2 {
					after = append(after, bufs[r].read...)
				}
				for i := range before {
					if !bytes.Equal(before[i], after[i]) {
						t.Errorf("read-only buffer %d of ranks 0 and 1 changed by the failed operation", i)
					}
				}
				for r := range 2 {
					for _, b := range bufs[r].written {
						fillSentinel(b)
					}
				}
				if kind.lateTraffic {
					ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel2()
					// It may even succeed: its peers' frames can be all it needs.
					op.run(ctx2, groups[2], bufs[2])
				}
				closed := make(chan struct{})
				go func() { closeGroups(groups); close(closed) }()
				select {
				case <-closed:
				case <-time.After(30 * time.Second):
					t.Fatal("the groups did not close within 30s")
				}
				for r := range 2 {
					for i, b := range bufs[r].written {
						if at := sentinelBroken(b); at >= 0 {
							t.Errorf("rank %d's written buffer %d changed at byte %d after the failed operation returned", r, i, at)
						}
					}
				}
			})
		}
	}
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

const sentinel = 0xa5

func fillSentinel(b []byte) {
	for i := range b {
		b[i] = sentinel
	}
}

// sentinelBroken returns the first byte of b that is not the sentinel, or -1.
func sentinelBroken(b []byte) int {
	for i, v := range b {
		if v != sentinel {
			return i
		}
	}
	return -1
}

// gateConn holds a connection's writes past a byte budget until released,
// as a peer stalled in the middle of a frame would, and lets the test see
// what its reader has consumed and whether it waits in Read.
type gateConn struct {
	net.Conn
	budget  atomic.Int64 // bytes Write passes before holding; < 0: no limit
	open    chan struct{}
	read    atomic.Int64
	reading atomic.Bool
}

// Write is called by one goroutine at a time (the link's sender).
func (c *gateConn) Write(p []byte) (int, error) {
	b := c.budget.Load()
	if b < 0 || int64(len(p)) <= b {
		if b >= 0 {
			c.budget.Store(b - int64(len(p)))
		}
		return c.Conn.Write(p)
	}
	n, err := c.Conn.Write(p[:b])
	c.budget.Store(-1)
	if err != nil {
		return n, err
	}
	<-c.open
	m, err := c.Conn.Write(p[n:])
	return n + m, err
}

func (c *gateConn) Read(p []byte) (int, error) {
	c.reading.Store(true)
	n, err := c.Conn.Read(p)
	c.reading.Store(false)
	c.read.Add(int64(n))
	return n, err
}

func (c *gateConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// gatedTransport wraps every connection of an in-process network in a
// gateConn, by (rank, peer).
type gatedTransport struct {
	net   *InprocNetwork
	mu    sync.Mutex
	conns map[[2]int]*gateConn
}

func (t *gatedTransport) Connect(ctx context.Context, m Membership) ([]net.Conn, error) {
	conns, err := t.net.Connect(ctx, m)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for peer, c := range conns {
		if c != nil {
			g := &gateConn{Conn: c, open: make(chan struct{})}
			g.budget.Store(-1)
			t.conns[[2]int{m.Rank, peer}] = g
			conns[peer] = g
		}
	}
	return conns, nil
}

// TestFailedReceiveStopsWriting: a rank whose operation fails while it is
// in the middle of reading a frame into the caller's buffer (rank 1 stalled
// half-way through a 256 KiB broadcast frame) returns only once that read
// has been abandoned: the rest of the frame, sent after the return, never
// reaches the buffer, which the test has meanwhile overwritten. The failure
// is rank 0's own: its context cancelled, or Abort (what the elastic agent
// does on a generation change).
func TestFailedReceiveStopsWriting(t *testing.T) {
	const frame = 256 << 10 // one binomial-broadcast frame
	const budget = headerSize + frame/3
	for _, kind := range []string{"cancelled", "aborted"} {
		t.Run(kind, func(t *testing.T) {
			tr := &gatedTransport{net: NewInprocNetwork(), conns: map[[2]int]*gateConn{}}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			groups := make([]*Group, 2)
			mustAll(t, onEveryRank(groups, func(r int, _ *Group) error {
				var err error
				groups[r], err = Join(ctx, tr, Membership{Job: "gate", Generation: 1, Rank: r, Peers: []string{"a", "b"}}, Options{Timeout: time.Minute})
				return err
			}))
			t.Cleanup(func() { closeGroups(groups) })
			tr.mu.Lock()
			out, in := tr.conns[[2]int{1, 0}], tr.conns[[2]int{0, 1}]
			tr.mu.Unlock()
			out.budget.Store(budget)
			released := false
			release := func() {
				if !released {
					released = true
					close(out.open)
				}
			}
			defer release()

			buf := make([]byte, frame)
			opCtx, opCancel := context.WithCancel(ctx)
			defer opCancel()
			done := make(chan error, 2)
			go func() { done <- groups[0].Broadcast(opCtx, Bytes(buf), 1) }()
			go func() { done <- groups[1].Broadcast(ctx, Bytes(randomBytes(rand.New(rand.NewPCG(1, 2)), frame)), 1) }()
			waitUntil(t, 10*time.Second, "rank 0 waiting in Read in the middle of rank 1's frame", func() bool {
				return in.read.Load() >= budget && in.reading.Load()
			})
			if kind == "cancelled" {
				opCancel()
			} else {
				groups[0].Abort("generation changed")
			}
			select {
			case err := <-done:
				if !errors.Is(err, ErrAborted) {
					t.Fatalf("rank 0: %v, want ErrAborted", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("rank 0's broadcast did not fail within 10s")
			}
			fillSentinel(buf)
			release() // the rest of the frame arrives
			select {
			case <-done: // rank 1 learns of the abort
			case <-time.After(30 * time.Second):
				t.Fatal("rank 1's broadcast did not end within 30s of the release")
			}
			closed := make(chan struct{})
			go func() { closeGroups(groups); close(closed) }()
			select {
			case <-closed:
			case <-time.After(30 * time.Second):
				t.Fatal("the groups did not close within 30s")
			}
			if at := sentinelBroken(buf); at >= 0 {
				t.Fatalf("rank 0's buffer changed at byte %d after its failed broadcast returned", at)
			}
		})
	}
}
