package collective

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// shmRanks starts n ranks in this process, each with its own TCP transport
// wrapped by NewTransport(kind), sharing dir; hosts (optional) is the
// membership's Hosts.
type shmRanks struct {
	tcps []*TCPTransport
	trs  []Transport
	addr []string
}

func newShmRanks(t testing.TB, n int, kind TransportKind, dir string) *shmRanks {
	t.Helper()
	s := &shmRanks{}
	for range n {
		tcp, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tcp.Close() })
		tr, err := NewTransport(kind, tcp, ShmOptions{Dir: dir, SlabBytes: 64 << 10, RingBytes: 16 << 10})
		if err != nil {
			t.Fatal(err)
		}
		s.tcps = append(s.tcps, tcp)
		s.trs = append(s.trs, tr)
		s.addr = append(s.addr, tcp.Addr())
	}
	return s
}

// join connects ranks (indices into s) as generation gen; hosts may be nil.
func (s *shmRanks) join(t testing.TB, job string, gen uint64, ranks []int, hosts []string, opts Options) []*Group {
	t.Helper()
	peers := make([]string, len(ranks))
	for i, r := range ranks {
		peers[i] = s.addr[r]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	trs := make([]Transport, len(ranks))
	for i, r := range ranks {
		trs[i] = s.trs[r]
	}
	groups, err := JoinAll(ctx, trs, Membership{Job: job, Generation: gen, Peers: peers, Hosts: hosts}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeGroups(groups) })
	return groups
}

func shmFiles(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "phalanx-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestShmAllReduceProperty: random sizes, dtypes, ops and algorithms over
// shared memory (all ranks on one host, and a mixed group) agree bitwise on
// every rank and equal a serial reference.
func TestShmAllReduceProperty(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kind  TransportKind
		n     int
		hosts []string
	}{
		{"shm-2", TransportShm, 2, nil},
		{"shm-3", TransportShm, 3, nil},
		{"shm-4", TransportShm, 4, nil},
		{"auto-mixed-4", TransportAuto, 4, []string{"a", "a", "b", "b"}},
		{"auto-one-host-3", TransportAuto, 3, []string{"h", "h", "h"}},
		{"auto-hier-3x2", TransportAuto, 6, []string{"a", "b", "c", "a", "b", "c"}},
		{"auto-hier-2x3", TransportAuto, 6, []string{"a", "a", "a", "b", "b", "b"}},
		{"auto-uneven", TransportAuto, 5, []string{"a", "a", "a", "b", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newShmRanks(t, tc.n, tc.kind, dir)
			ranks := make([]int, tc.n)
			for i := range ranks {
				ranks[i] = i
			}
			groups := s.join(t, "prop", 1, ranks, tc.hosts, Options{SmallBytes: 1024, SegmentBytes: 4096})
			if files := shmFiles(t, dir); len(files) != 0 {
				t.Fatalf("segment files left after connecting: %v", files)
			}
			wantHier := tc.name == "auto-mixed-4" || strings.HasPrefix(tc.name, "auto-hier")
			wantFast := tc.kind == TransportShm || tc.name == "auto-one-host-3"
			for r, g := range groups {
				if (g.hier != nil) != wantHier || (g.fast != nil) != wantFast {
					t.Fatalf("rank %d: hierarchical %v (want %v), shared-memory fast path %v (want %v)", r, g.hier != nil, wantHier, g.fast != nil, wantFast)
				}
			}
			rng := rand.New(rand.NewPCG(uint64(tc.n), 7))
			for iter := range 40 {
				count := rng.IntN(70000)
				if iter%4 == 0 {
					count = rng.IntN(40)
				}
				op := []ReduceOp{Sum, Avg, Min, Max}[rng.IntN(4)]
				algo := []Algorithm{AlgoAuto, AlgoRing, AlgoRecursiveDoubling}[rng.IntN(3)]
				f64 := rng.IntN(2) == 0
				checkShmAllReduce(t, groups, rng, count, op, algo, f64)
			}
			closeGroups(groups)
			if files := shmFiles(t, dir); len(files) != 0 {
				t.Fatalf("segment files left after close: %v", files)
			}
		})
	}
}

// checkShmAllReduce runs checkAllReduce with the dtype f64 picks.
func checkShmAllReduce(t *testing.T, groups []*Group, rng *rand.Rand, count int, op ReduceOp, algo Algorithm, f64 bool) {
	t.Helper()
	if f64 {
		checkAllReduce[float64](t, groups, count, op, algo, rng.Uint64())
	} else {
		checkAllReduce[float32](t, groups, count, op, algo, rng.Uint64())
	}
}

// TestShmRejoinAndFailures: a rank that closes mid-job fails its peers'
// next operation with ErrPeerLost; the survivors rebuild generation 2 over
// the same transports and leave no files.
func TestShmRejoin(t *testing.T) {
	dir := t.TempDir()
	s := newShmRanks(t, 3, TransportShm, dir)
	g1 := s.join(t, "rejoin", 1, []int{0, 1, 2}, nil, Options{Timeout: 10 * time.Second})
	rng := rand.New(rand.NewPCG(1, 2))
	checkShmAllReduce(t, g1, rng, 1000, Sum, AlgoAuto, false)
	g1[2].Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := onEveryRank(g1[:2], func(r int, g *Group) error {
		return g.AllReduce(ctx, Float32s(make([]float32, 100)), Sum)
	})
	for r, err := range errs {
		var oe *OpError
		if !errors.Is(err, ErrPeerLost) || !errors.As(err, &oe) || oe.Rank != 2 {
			t.Fatalf("rank %d: %v, want ErrPeerLost naming rank 2", r, err)
		}
	}
	closeGroups(g1)
	g2 := s.join(t, "rejoin", 2, []int{0, 1}, nil, Options{})
	checkShmAllReduce(t, g2, rng, 5000, Max, AlgoAuto, true)
	closeGroups(g2)
	if files := shmFiles(t, dir); len(files) != 0 {
		t.Fatalf("segment files left: %v", files)
	}
}

func TestParseTransportKind(t *testing.T) {
	for _, k := range []TransportKind{TransportAuto, TransportTCP, TransportShm} {
		got, err := ParseTransportKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseTransportKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	_, err := ParseTransportKind("udp")
	if err == nil || !strings.Contains(err.Error(), `"udp"`) || !strings.Contains(err.Error(), "shm") {
		t.Errorf("ParseTransportKind(udp) = %v, want an error naming the value and the choices", err)
	}
}

// TestHostIdentity: the identity is stable. Without one (no boot id or
// /dev/shm) the test is skipped loudly, except in CI (CI=true), a Linux
// machine where host identity must work: there it fails.
func TestHostIdentity(t *testing.T) {
	a, err := HostIdentity()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no host identity in CI, where shared memory must work: %v", err)
		}
		t.Skipf("SKIPPING (no host identity here): %v", err)
	}
	b, _ := HostIdentity()
	if a == "" || a != b {
		t.Fatalf("HostIdentity() = %q then %q", a, b)
	}
}

func TestMembershipHostsValidated(t *testing.T) {
	m := Membership{Job: "j", Generation: 1, Peers: []string{"a", "b"}, Hosts: []string{"h"}}
	if err := m.validate(); err == nil {
		t.Fatal("one host for two peers accepted")
	}
	m.Hosts = []string{"h", ""}
	if err := m.validate(); err == nil {
		t.Fatal("an empty host accepted")
	}
	m.Hosts = []string{"h", "i"}
	if err := m.validate(); err != nil {
		t.Fatal(err)
	}
	tcp, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	tr, err := NewTransport(TransportShm, tcp, ShmOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := tr.Connect(ctx, m); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", "i")) {
		t.Fatalf("shm across hosts: %v", err)
	}
}

// TestShmFastBarrier: the fast path's barrier interleaves with allreduces on
// the same steps, and a barrier on one rank against an allreduce on the
// others is an ErrMismatch, not a hang or a wrong sum.
func TestShmFastBarrier(t *testing.T) {
	s := newShmRanks(t, 3, TransportShm, t.TempDir())
	groups := s.join(t, "barrier", 1, []int{0, 1, 2}, nil, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	barrier := func(g *Group) error {
		if err := g.begin(ctx, opBarrier, Uint8, 0, 0); err != nil {
			return err
		}
		return g.end(g.fast.barrier())
	}
	rng := rand.New(rand.NewPCG(3, 9))
	for i := range 6 {
		mustAll(t, onEveryRank(groups, func(_ int, g *Group) error { return barrier(g) }))
		checkShmAllReduce(t, groups, rng, 1+i*5000, Sum, AlgoAuto, i%2 == 0)
	}
	errs := onEveryRank(groups, func(i int, g *Group) error {
		if i == 0 {
			return barrier(g)
		}
		return g.AllReduce(ctx, Float32s(make([]float32, 8)), Sum)
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v, want ErrMismatch", r, err)
		}
	}
}

// TestSweepDeadOwners: Connect's sweep removes another job's segment whose
// creator has exited, and keeps one whose creator lives and one whose header
// is not (yet) valid.
func TestSweepDeadOwners(t *testing.T) {
	dir := t.TempDir()
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	write := func(name string, pid int, valid bool) string {
		b := make([]byte, ctrlSize)
		if valid {
			h := segHeader{kind: segKindRank, job: 7, gen: 1, world: 2, pid: uint32(pid), ring: 4096, slab: 4096}
			h.encode(b, segMagic)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	dead := write(rankSegName(7, 1, 0, 1), exited.Process.Pid, true)
	live := write(rankSegName(7, 1, 1, 2), os.Getpid(), true)
	blank := write(rankSegName(7, 1, 2, 3), 0, false)
	tcp, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	tr, err := NewTransport(TransportShm, tcp, ShmOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	tr.(*ShmTransport).sweep(JobHash("another job"), 1)
	for path, want := range map[string]bool{dead: false, live: true, blank: true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(path), err == nil, want)
		}
	}
}

// TestShmNoLostWakeup: with spinning off, every wait on a byte ring parks,
// so a few thousand allgathers through 4 KiB rings go through the
// sleep/wake handshake at nearly every step of every rank, and nothing but a
// wake-up (or the deadline) ends a park. A lost wake-up leaves a rank parked
// until the operation times out. Under -race this caught the race runtime's
// unfenced atomic stores (see publish32), which a timer used to paper over.
// The byte rings' park counters prove the ranks did sleep: a wait that spun
// or yielded instead would pass the transfers without testing a wake-up.
func TestShmNoLostWakeup(t *testing.T) {
	const n, iters = 2, 300
	dir := t.TempDir()
	trs := make([]Transport, n)
	addrs := make([]string, n)
	for i := range n {
		tcp, err := ListenTCP(TCPOptions{Bind: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tcp.Close() })
		if trs[i], err = NewTransport(TransportShm, tcp, ShmOptions{Dir: dir, RingBytes: 4096, SlabBytes: 4096, Spin: -1}); err != nil {
			t.Fatal(err)
		}
		addrs[i] = tcp.Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	groups := make([]*Group, n)
	mustAll(t, onEveryRank(groups, func(i int, _ *Group) error {
		var err error
		groups[i], err = Join(ctx, trs[i], Membership{Job: "wakeup", Generation: 1, Rank: i, Peers: addrs}, Options{Timeout: 20 * time.Second})
		return err
	}))
	defer closeGroups(groups)
	parks := func() (n uint64) {
		for _, g := range groups {
			for _, l := range g.links {
				if l == nil {
					continue
				}
				c, ok := l.conn.(*shmConn)
				if !ok {
					t.Fatalf("rank %d's link to rank %d runs over %T, want shared memory", g.Rank(), l.peer, l.conn)
				}
				n += c.parks.Load()
			}
		}
		return n
	}
	before := parks()
	rng := rand.New(rand.NewPCG(3, 1))
	for iter := range iters {
		per := 1 + rng.IntN(400<<10) // up to 100 rings a rank
		errs := onEveryRank(groups, func(r int, g *Group) error {
			in := make([]byte, per)
			for k := range in {
				in[k] = byte(r*31 + k + iter)
			}
			out := make([]byte, n*per)
			if err := g.AllGather(ctx, Bytes(in), Bytes(out)); err != nil {
				return err
			}
			for q := range n {
				for k := range per {
					if out[q*per+k] != byte(q*31+k+iter) {
						return fmt.Errorf("iteration %d: byte %d of rank %d's part is %d, want %d", iter, k, q, out[q*per+k], byte(q*31+k+iter))
					}
				}
			}
			return nil
		})
		mustAll(t, errs)
	}
	// Every iteration moves at least one ring's worth through 4 KiB rings
	// on average, so a rank waits for its peer at least once per iteration.
	if n := parks() - before; n < iters {
		t.Fatalf("%d parks in %d allgathers: the waits spun instead of sleeping, so no wake-up was tested", n, iters)
	} else {
		t.Logf("%d parks in %d allgathers", n, iters)
	}
}

// TestShmCancelWakesFastPath: a rank asleep in the single-copy allreduce
// (its peer never calls) wakes when its context is cancelled, whether the
// context is the one its previous operations used (whose watch stays
// registered between operations) or a new one.
func TestShmCancelWakesFastPath(t *testing.T) {
	for _, sameCtx := range []bool{true, false} {
		t.Run(fmt.Sprintf("same-context=%v", sameCtx), func(t *testing.T) {
			s := newShmRanks(t, 2, TransportShm, t.TempDir())
			groups := s.join(t, "cancel", 1, []int{0, 1}, nil, Options{Timeout: time.Minute})
			if groups[0].fast == nil {
				t.Fatal("no single-copy path between two shared-memory ranks")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for range 3 {
				mustAll(t, onEveryRank(groups, func(_ int, g *Group) error {
					return g.AllReduce(ctx, Float32s(make([]float32, 64)), Sum)
				}))
			}
			opCtx, opCancel := ctx, cancel
			if !sameCtx {
				opCtx, opCancel = context.WithCancel(context.Background())
				defer opCancel()
			}
			done := make(chan error, 1)
			go func() { done <- groups[0].AllReduce(opCtx, Float32s(make([]float32, 64)), Sum) }()
			waitUntil(t, 10*time.Second, "rank 0 asleep on its doorbell in the single-copy allreduce", func() bool {
				return groups[0].fast.sleep[0].Load() != 0
			})
			opCancel()
			select {
			case err := <-done:
				if !errors.Is(err, ErrAborted) || !errors.Is(err, context.Canceled) {
					t.Fatalf("got %v, want ErrAborted wrapping context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("rank 0 still asleep 10s after its context was cancelled")
			}
		})
	}
}

// TestShmGoodbyeDuringAnnouncement: a peer that has announced (its word
// stored) may still be moving the other ranks' counters when a third rank,
// having seen its own counter complete, finishes the operation and says
// goodbye. A rank still waiting for the announcement in flight must keep
// waiting, not blame the peer that left: with every peer's word in, no rank
// lags. (A fresh-clone CI run failed a 4-rank job's final barrier this way:
// "rank 0 closed its group", and the ring was rebuilt for nothing.) Here
// rank 1's announcement of the barrier reaches rank 0 and is held before
// rank 2; rank 0 finishes and closes its group; rank 2, woken by the
// goodbye, looks again, and only then does rank 1's announcement go on.
func TestShmGoodbyeDuringAnnouncement(t *testing.T) {
	s := newShmRanks(t, 3, TransportShm, t.TempDir())
	groups := s.join(t, "goodbye", 1, []int{0, 1, 2}, nil, Options{Timeout: time.Minute})
	if groups[0].fast == nil {
		t.Fatal("no single-copy path between three shared-memory ranks")
	}
	ctx := testContext(t)
	held, release := make(chan struct{}), make(chan struct{})
	var hold, let sync.Once
	letGo := func() { let.Do(func() { close(release) }) }
	t.Cleanup(letGo) // registered after the groups' Close: runs before it
	groups[1].fast.beforeArrive = func(k shmWaitKind, peer int) {
		if k == waitPosted && peer == 2 {
			hold.Do(func() { close(held); <-release })
		}
	}
	errs := make([]chan error, 3)
	var ended [3]atomic.Bool
	for r, g := range groups {
		errs[r] = make(chan error, 1)
		go func() { errs[r] <- g.Barrier(ctx); ended[r].Store(true) }()
	}
	testwait.Recv(t, held, 10*time.Second, "rank 1 announcing its barrier to rank 0 and not yet to rank 2")
	if err := testwait.Recv(t, errs[0], 10*time.Second, "rank 0's barrier"); err != nil {
		t.Fatalf("rank 0: %v", err)
	}
	go groups[0].Close()
	f2 := groups[2].fast
	waitUntil(t, 10*time.Second, "rank 2 to read rank 0's goodbye", func() bool { return groups[2].links[0].peerBye.Load() })
	before := f2.wakes.Load()
	f2.interrupt() // at least one more look, whatever the goodbye's own wake-up did
	waitUntil(t, 10*time.Second, "rank 2 to look again after rank 0's goodbye, or to end its barrier", func() bool {
		return f2.wakes.Load() > before || ended[2].Load()
	})
	letGo()
	for _, r := range []int{1, 2} {
		if err := testwait.Recv(t, errs[r], 10*time.Second, fmt.Sprintf("rank %d's barrier", r)); err != nil {
			t.Errorf("rank %d: %v (rank 1's announcement was on its way)", r, err)
		}
	}
}

// TestShmWait: the fast path's waits follow the ranks and the cores when
// the options leave them (0): a long spin and no yield when every rank
// can have a core, a short spin and then yields when ranks outnumber the
// cores; given counts are kept, negative ones are none. The byte rings
// keep their own default.
func TestShmWait(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		spin, yield, ranks, cores int
		wantSpin, wantYield       int
	}{
		{"alone", 0, 0, 2, 2, shmSpinAlone, 0},
		{"alone, fewer ranks", 0, 0, 2, 8, shmSpinAlone, 0},
		{"oversubscribed", 0, 0, 4, 2, shmSpinShared, shmYieldShared},
		{"given counts", 50, 7, 4, 2, 50, 7},
		{"given spin, oversubscribed", 50, 0, 4, 2, 50, shmYieldShared},
		{"never spin, never yield", -1, -1, 4, 2, 0, 0},
		{"never yield alone", 0, -1, 2, 2, shmSpinAlone, 0},
	} {
		spin, yield := shmWait(tc.spin, tc.yield, tc.ranks, tc.cores)
		if spin != tc.wantSpin || yield != tc.wantYield {
			t.Errorf("%s: spin %d yield %d, want %d and %d", tc.name, spin, yield, tc.wantSpin, tc.wantYield)
		}
	}
	if spin, yield := ringWait(0, 0); spin != 200 || yield != 0 {
		t.Errorf("the rings' default waits: spin %d yield %d, want 200 and 0", spin, yield)
	}
	if spin, yield := ringWait(-1, -3); spin != 0 || yield != 0 {
		t.Errorf("the rings' waits with negative options: spin %d yield %d, want none", spin, yield)
	}
}
