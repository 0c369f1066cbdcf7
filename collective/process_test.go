package collective

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/launch"
)

// The process tests run each rank as a child process: this test binary
// re-executed with PHALANX_TEST_RANK set, driven by one command per stdin line:
//
//	allreduce <algo> <n>...   one allreduce per size; answers "ok <sha256 of each result>"
//	loop <n>                  allreduces until one fails; answers "looping" after the first, then "err <kind> <rank>"
//	rejoin <gen> <rank> <peers,...> [hosts,...]  closes the group and joins a new generation on the same port; answers "joined"
//
// PHALANX_TEST_TRANSPORT picks the transport (tcp, shm or auto, default tcp)
// PHALANX_TEST_SHM_DIR the shared-memory directory, PHALANX_TEST_BIND the
// listen address and PHALANX_TEST_HOSTS the membership's Hosts.
//
// Failures answer "err <kind> <rank> <message>".

func TestMain(m *testing.M) {
	if os.Getenv("PHALANX_TEST_RANK") != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}

func childMain() int {
	rank, _ := strconv.Atoi(os.Getenv("PHALANX_TEST_RANK"))
	timeout, _ := time.ParseDuration(os.Getenv("PHALANX_TEST_TIMEOUT"))
	opts := Options{Timeout: timeout}
	bind := "127.0.0.1:0"
	if b := os.Getenv("PHALANX_TEST_BIND"); b != "" {
		bind = b
	}
	var hosts []string
	if h := os.Getenv("PHALANX_TEST_HOSTS"); h != "" {
		hosts = strings.Split(h, ",")
	}
	tr, err := ListenTCP(TCPOptions{Bind: bind})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kind := TransportTCP
	if k := os.Getenv("PHALANX_TEST_TRANSPORT"); k != "" {
		if kind, err = ParseTransportKind(k); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	transport, err := NewTransport(kind, tr, ShmOptions{Dir: os.Getenv("PHALANX_TEST_SHM_DIR")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	in := bufio.NewReader(os.Stdin)
	peers, err := launch.Announce(os.Stdout, in, tr.Addr())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// A child outlives no test: one whose parent died before killing it
	// (go test's own timeout) gives up rather than looping on.
	ctx, cancel := context.WithTimeout(context.Background(), childLife)
	defer cancel()
	g, err := Join(ctx, transport, Membership{Job: "proc-test", Generation: 1, Rank: rank, Peers: peers, Hosts: hosts}, opts)
	if err != nil {
		fmt.Printf("err %s\n", describe(err))
		return 1
	}
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return 0
		}
		f := strings.Fields(line)
		switch f[0] {
		case "allreduce":
			algo, _ := ParseAlgorithm(f[1])
			var sums []string
			for _, s := range f[2:] {
				n, _ := strconv.Atoi(s)
				x := childInput(g.Rank(), n)
				if err := g.AllReduceWith(ctx, Float32s(x), Sum, algo); err != nil {
					fmt.Printf("err %s\n", describe(err))
					break
				}
				h := sha256.Sum256(bytesOf(x))
				sums = append(sums, hex.EncodeToString(h[:8]))
			}
			if len(sums) == len(f)-2 {
				fmt.Printf("ok %s\n", strings.Join(sums, " "))
			}
		case "plane":
			fmt.Printf("plane %s\n", g.DataPlane())
		case "time": // time <n> <iters>: seconds per allreduce after a warm-up and a barrier
			n, _ := strconv.Atoi(f[1])
			iters, _ := strconv.Atoi(f[2])
			x := childInput(g.Rank(), n)
			err := g.AllReduce(ctx, Float32s(x), Sum)
			if err == nil {
				err = g.Barrier(ctx)
			}
			start := time.Now()
			for i := 0; i < iters && err == nil; i++ {
				err = g.AllReduce(ctx, Float32s(x), Sum)
			}
			if err != nil {
				fmt.Printf("err %s\n", describe(err))
				break
			}
			fmt.Printf("time %g\n", time.Since(start).Seconds()/float64(iters))
		case "loop":
			n, _ := strconv.Atoi(f[1])
			x := make([]float32, n)
			for i := 0; ; i++ {
				if err := g.AllReduce(ctx, Float32s(x), Sum); err != nil {
					fmt.Printf("err %s\n", describe(err))
					break
				}
				if i == 0 {
					fmt.Println("looping")
				}
			}
		case "rejoin":
			gen, _ := strconv.ParseUint(f[1], 10, 64)
			r, _ := strconv.Atoi(f[2])
			g.Close()
			var hosts []string
			if len(f) > 4 {
				hosts = strings.Split(f[4], ",")
			}
			g, err = Join(ctx, transport, Membership{Job: "proc-test", Generation: gen, Rank: r, Peers: strings.Split(f[3], ","), Hosts: hosts}, opts)
			if err != nil {
				fmt.Printf("err %s\n", describe(err))
				continue
			}
			fmt.Println("joined")
		}
	}
}

// childInput is rank r's deterministic input of n elements: values of both
// signs and magnitudes from 2^-10 to 2^10, so that their float32 sums depend
// on the order of the additions (agreeOnSum checks that they do). Bitwise
// agreement then says the ranks reduced in one order, and equality with
// reduceInOrder that it was the order the algorithm promises.
func childInput(r, n int) []float32 {
	x := make([]float32, n)
	s := uint64(r+1) * 0x9e3779b97f4a7c15
	for i := range x {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		v := math.Ldexp(1+float64(s>>40)/(1<<24), int(s>>32&31)%21-10)
		if s&1 != 0 {
			v = -v
		}
		x[i] = float32(v)
	}
	return x
}

// plane is how a group of child ranks reduces: fast, every peer on shared
// memory (the single-copy allreduce); otherwise the algorithms over links,
// hierarchically for the ring's sizes when hosts lay the ranks out as
// newHierarchy wants (at least two hosts with the same number, at least
// two, of ranks each).
type plane struct {
	fast  bool
	hosts []string
}

// hierarchy returns the ranks of each host, hosts in order of first
// appearance, or nil when p's hosts make no hierarchy.
func (p plane) hierarchy() [][]int {
	var order []string
	byHost := map[string][]int{}
	for r, h := range p.hosts {
		if _, ok := byHost[h]; !ok {
			order = append(order, h)
		}
		byHost[h] = append(byHost[h], r)
	}
	if len(order) < 2 || len(byHost[order[0]]) < 2 {
		return nil
	}
	out := make([][]int, len(order))
	for i, h := range order {
		if len(byHost[h]) != len(byHost[order[0]]) {
			return nil
		}
		out[i] = byHost[h]
	}
	return out
}

// defaultSmallBytes is AlgoAuto's threshold in the children's groups.
func defaultSmallBytes() int {
	o := Options{}
	o.setDefaults()
	return o.SmallBytes
}

// ringSum is element i's sum along a ring of members (values by member)
// for chunk c: the ring reduces it from position c+1 round to position c.
func ringSum(vals func(member, i int) float32, members []int, c, i int) float32 {
	N := len(members)
	acc := vals(members[(c+1)%N], i)
	for k := 2; k <= N; k++ {
		acc += vals(members[(c+k)%N], i)
	}
	return acc
}

// reduceInOrder is the float32 sum of the ranks' inputs in the order the
// group reduces them. The single-copy allreduce adds in rank order 0..N−1
// for every element. Over links the algorithm decides (auto: recursive
// doubling up to Options.SmallBytes, the ring above): the ring reduces
// chunk c (of chunking{n, N}) from rank c+1 round to rank c; recursive
// doubling pairs the first ranks, then adds partners' sums along the
// butterfly; the hierarchical ring reduces each local shard along its
// host's ring, then its pieces along the ring of the hosts.
func reduceInOrder(p plane, algo string, inputs [][]float32, n int) []float32 {
	N := len(inputs)
	out := make([]float32, n)
	in := func(r, i int) float32 { return inputs[r][i] }
	ring := algo == "ring" || algo == "auto" && 4*n > defaultSmallBytes()
	hosts := p.hierarchy()
	switch {
	case p.fast:
		for i := range out {
			acc := inputs[0][i]
			for _, x := range inputs[1:] {
				acc += x[i]
			}
			out[i] = acc
		}
	case ring && hosts != nil:
		L, H := len(hosts[0]), len(hosts)
		local := chunking{count: n, world: L}
		hostOrder := make([]int, H)
		for h := range hostOrder {
			hostOrder[h] = h
		}
		for pos := range L {
			lo, hi := local.bounds(pos)
			y := make([][]float32, H) // each host's local sum of the shard
			for h := range H {
				y[h] = make([]float32, hi-lo)
				for i := lo; i < hi; i++ {
					y[h][i-lo] = ringSum(in, hosts[h], pos, i)
				}
			}
			cross := chunking{count: hi - lo, world: H}
			for d := range H {
				a, b := cross.bounds(d)
				for j := a; j < b; j++ {
					out[lo+j] = ringSum(func(h, j int) float32 { return y[h][j] }, hostOrder, d, j)
				}
			}
		}
	case ring:
		all := make([]int, N)
		for r := range all {
			all[r] = r
		}
		ck := chunking{count: n, world: N}
		for c := range N {
			lo, hi := ck.bounds(c)
			for i := lo; i < hi; i++ {
				out[i] = ringSum(in, all, c, i)
			}
		}
	default:
		pow := 1
		for pow*2 <= N {
			pow *= 2
		}
		extra := N - pow
		v, next := make([]float32, pow), make([]float32, pow)
		for i := range out {
			for nr := range pow {
				if nr < extra {
					v[nr] = inputs[2*nr][i] + inputs[2*nr+1][i]
				} else {
					v[nr] = inputs[nr+extra][i]
				}
			}
			for mask := 1; mask < pow; mask <<= 1 {
				for nr := range pow {
					next[nr] = v[nr] + v[nr^mask]
				}
				v, next = next, v
			}
			out[i] = v[0]
		}
	}
	return out
}

func describe(err error) string {
	var oe *OpError
	if !errors.As(err, &oe) {
		return "other -1 " + err.Error()
	}
	kind := map[error]string{ErrPeerLost: "peer-lost", ErrTimeout: "timeout", ErrMismatch: "mismatch",
		ErrProtocol: "protocol", ErrAborted: "aborted", ErrClosed: "closed"}[oe.Kind]
	return fmt.Sprintf("%s %d %s", kind, oe.Rank, strings.ReplaceAll(err.Error(), "\n", " "))
}

// startRanks starts n child ranks joined as generation 1 over TCP.
func startRanks(t *testing.T, n int, timeout time.Duration) []*launch.Proc {
	t.Helper()
	return startRanksOn(t, n, timeout, procTransport{})
}

// procTransport is the children's transport: kind "" is TCP; dir is the
// shared-memory directory.
type procTransport struct{ kind, dir string }

// startRanksOn starts n child ranks joined as generation 1 over tr.
func startRanksOn(t *testing.T, n int, timeout time.Duration, tr procTransport) []*launch.Proc {
	t.Helper()
	return spawnRanks(t, n, func(ctx context.Context, rank int, exe string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("PHALANX_TEST_RANK=%d", rank), "PHALANX_TEST_TIMEOUT="+timeout.String(),
			"PHALANX_TEST_TRANSPORT="+tr.kind, "PHALANX_TEST_SHM_DIR="+tr.dir)
		return cmd
	})
}

// spawnRanks starts n child ranks, command(ctx, rank, exe) making each
// one's command line for this test binary exe; they are killed when the
// test ends.
func spawnRanks(t testing.TB, n int, command func(ctx context.Context, rank int, exe string) *exec.Cmd) []*launch.Proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	startCtx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	procs, err := launch.Start(startCtx, n, func(rank int) *exec.Cmd {
		cmd := command(ctx, rank, exe)
		cmd.Stderr = os.Stderr
		return cmd
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.Signal(syscall.SIGCONT)
			p.In.Close()
		}
		launch.Kill(procs)
	})
	return procs
}

func tell(t testing.TB, procs []*launch.Proc, cmd string) {
	t.Helper()
	for _, p := range procs {
		if _, err := fmt.Fprintln(p.In, cmd); err != nil {
			t.Fatalf("rank %d: %v", p.Rank, err)
		}
	}
}

// childLife bounds a child rank's life: go test's default timeout.
const childLife = 10 * time.Minute

// procWait bounds each wait for a child's line: far above any operation's
// timeout, so that only a hang trips it, and far below go test's.
const procWait = 2 * time.Minute

// expect reads p's next line, which must start with prefix, within
// procWait.
func expect(t testing.TB, p *launch.Proc, prefix string) string {
	t.Helper()
	type read struct {
		line string
		err  error
	}
	ch := make(chan read, 1)
	go func() { // a child killed at the test's end ends a read left behind
		line, err := p.ReadLine()
		ch <- read{line, err}
	}()
	var line string
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		line = r.line
	case <-time.After(procWait):
		t.Fatalf("rank %d (pid %d): waited %v for a line starting %q", p.Rank, p.Pid(), procWait, prefix)
	}
	if !strings.HasPrefix(line, prefix) {
		t.Fatalf("rank %d (pid %d): got %q, want %q...", p.Rank, p.Pid(), line, prefix)
	}
	return line
}

// TestProcessesAllReduce: N = 2..4 OS processes over loopback TCP agree bit for
// bit and match the sum computed here.
func TestProcessesAllReduce(t *testing.T) {
	sizes := []int{0, 1, 13, 4099, 1<<20 + 3}
	for n := 2; n <= 4; n++ {
		procs := startRanks(t, n, 30*time.Second)
		for _, algo := range []string{"ring", "rd", "auto"} {
			agreeOnSum(t, procs, plane{}, algo, sizes)
		}
	}
}

// signalMidLoop starts four ranks looping on allreduce of n elements, sends
// sig to rank victim, and checks that every survivor reports kind naming the
// victim. It returns the victim and the survivors in rank order.
func signalMidLoop(t *testing.T, timeout time.Duration, n, victim int, sig syscall.Signal, kind string) (*launch.Proc, []*launch.Proc) {
	t.Helper()
	return signalMidLoopOn(t, timeout, n, victim, sig, kind, procTransport{})
}

// signalMidLoopOn is signalMidLoop over tr.
func signalMidLoopOn(t *testing.T, timeout time.Duration, n, victim int, sig syscall.Signal, kind string, tr procTransport) (*launch.Proc, []*launch.Proc) {
	t.Helper()
	procs := startRanksOn(t, 4, timeout, tr)
	tell(t, procs, fmt.Sprintf("loop %d", n))
	for _, p := range procs {
		expect(t, p, "looping")
	}
	if err := procs[victim].Signal(sig); err != nil {
		t.Fatal(err)
	}
	var survivors []*launch.Proc
	for _, p := range procs {
		if p.Rank == victim {
			continue
		}
		survivors = append(survivors, p)
		line := expect(t, p, "err")
		if f := strings.Fields(line); f[1] != kind || f[2] != strconv.Itoa(victim) {
			t.Errorf("rank %d: %q, want %s naming rank %d", p.Rank, line, kind, victim)
		}
	}
	return procs[victim], survivors
}

// TestProcessKilledMidOperation: SIGKILL one of four ranks while they loop on
// allreduce; every survivor gets ErrPeerLost naming it, then the survivors
// rebuild generation 2 on the same ports and allreduce correctly.
func TestProcessKilledMidOperation(t *testing.T) {
	_, survivors := signalMidLoop(t, 30*time.Second, 262144, 2, syscall.SIGKILL, "peer-lost")
	rebuild(t, survivors, plane{})
}

// stoppedTimeout is the operation timeout of the SIGSTOP tests: what they
// prove is that the stopped rank is named, not how soon, and a shorter one
// lets a loaded machine time out a live rank instead (a survivor naming
// another survivor, or generation 2's allreduce failing).
const stoppedTimeout = 10 * time.Second

// TestProcessStoppedMidOperation: SIGSTOP one rank; every survivor gets
// ErrTimeout naming it; generation 2 without it works; the stopped rank, once
// continued, fails rather than returning a result.
func TestProcessStoppedMidOperation(t *testing.T) {
	victim, survivors := signalMidLoop(t, stoppedTimeout, 65536, 1, syscall.SIGSTOP, "timeout")
	rebuild(t, survivors, plane{})
	if err := victim.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	expect(t, victim, "err")
}

// TestStoppedPeerWaiterIdle: a rank whose peer is stopped (SIGSTOP) in the
// middle of an allreduce waits for it without burning CPU, over TCP and
// over shared memory (the single-copy path, whose waits spin briefly and
// then sleep on a futex). The waiter's CPU time (utime+stime from
// /proc/<pid>/stat) over the whole wait, from the stop to its ErrTimeout
// three seconds on, must stay under 5% of that wait.
func TestStoppedPeerWaiterIdle(t *testing.T) {
	for _, tc := range []struct {
		name string
		tr   func(t *testing.T) procTransport
	}{
		{"tcp", func(*testing.T) procTransport { return procTransport{} }},
		{"shm", func(t *testing.T) procTransport { return procTransport{kind: "shm", dir: t.TempDir()} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 3 * time.Second
			procs := startRanksOn(t, 2, timeout, tc.tr(t))
			tell(t, procs, "loop 65536")
			for _, p := range procs {
				expect(t, p, "looping")
			}
			waiter, victim := procs[0], procs[1]
			if err := victim.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			cpu0, at0 := procCPU(t, waiter.Pid()), time.Now()
			line := expect(t, waiter, "err")
			cpu1, at1 := procCPU(t, waiter.Pid()), time.Now()
			if f := strings.Fields(line); f[1] != "timeout" || f[2] != "1" {
				t.Fatalf("the waiter ended with %q, want a timeout naming rank 1", line)
			}
			waited, used := at1.Sub(at0), cpu1-cpu0
			if waited < time.Second {
				t.Fatalf("the wait measured lasted %v: the %v operation timeout should have held the waiter longer", waited, timeout)
			}
			t.Logf("waiter (pid %d) used %v of CPU while waiting %v on a stopped peer", waiter.Pid(), used, waited.Round(time.Millisecond))
			if used > waited/20 {
				t.Errorf("the waiter used %v of CPU in %v waiting on a stopped peer, more than 5%%: it spins", used, waited.Round(time.Millisecond))
			}
		})
	}
}

// procCPU is the CPU time (user and system) process pid has used, from
// /proc/<pid>/stat, in clock ticks of 10ms (USER_HZ on Linux).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) start at the state, field 3.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// rebuild joins the survivors as generation 2 (ranks renumbered in order, same
// ports) and checks an allreduce; pl is how generation 2 reduces.
func rebuild(t *testing.T, survivors []*launch.Proc, pl plane) {
	t.Helper()
	var addrs []string
	for _, p := range survivors {
		addrs = append(addrs, p.Addr)
	}
	for i, p := range survivors {
		fmt.Fprintf(p.In, "rejoin 2 %d %s\n", i, strings.Join(addrs, ","))
	}
	for _, p := range survivors {
		expect(t, p, "joined")
	}
	agreeOnSum(t, survivors, pl, "auto", []int{1000, 300000})
}

// TestShmProcessesAllReduce: four OS processes over shared memory (the
// single-copy path, sizes below, at and above a slab) and over auto with no
// host identities (TCP) agree bit for bit and match the sum; no segment file
// outlives the connection.
func TestShmProcessesAllReduce(t *testing.T) {
	sizes := []int{0, 1, 13, 4099, 1<<18 + 1, 1<<20 + 3}
	dir := t.TempDir()
	procs := startRanksOn(t, 4, 30*time.Second, procTransport{kind: "shm", dir: dir})
	for _, algo := range []string{"ring", "rd", "auto"} {
		agreeOnSum(t, procs, plane{fast: true}, algo, sizes)
	}
	if files := shmFiles(t, dir); len(files) != 0 {
		t.Fatalf("segment files left: %v", files)
	}
}

// TestShmProcessKilledMidOperation: SIGKILL one of four ranks looping on the
// shared-memory allreduce; every survivor gets ErrPeerLost naming it; the
// survivors rebuild generation 2 and no segment file is left.
func TestShmProcessKilledMidOperation(t *testing.T) {
	dir := t.TempDir()
	tr := procTransport{kind: "shm", dir: dir}
	_, survivors := signalMidLoopOn(t, 30*time.Second, 262144, 2, syscall.SIGKILL, "peer-lost", tr)
	rebuild(t, survivors, plane{fast: true})
	if files := shmFiles(t, dir); len(files) != 0 {
		t.Fatalf("segment files left: %v", files)
	}
}

// TestShmProcessStoppedMidOperation: SIGSTOP one rank; every survivor gets
// ErrTimeout naming it; generation 2 without it works; continued, the
// stopped rank fails.
func TestShmProcessStoppedMidOperation(t *testing.T) {
	dir := t.TempDir()
	tr := procTransport{kind: "shm", dir: dir}
	victim, survivors := signalMidLoopOn(t, stoppedTimeout, 65536, 1, syscall.SIGSTOP, "timeout", tr)
	rebuild(t, survivors, plane{fast: true})
	if err := victim.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	expect(t, victim, "err")
	if files := shmFiles(t, dir); len(files) != 0 {
		t.Fatalf("segment files left: %v", files)
	}
}

// agreeOnSum runs an allreduce of each size with algo on procs, whose group
// reduces as pl says, and checks that every rank got the same bits, equal
// to reduceInOrder's. The inputs must tell orders apart: for every size of
// a few elements and more, the sums in rank order and in reverse differ
// somewhere, so a change of order (on one rank or on all) is caught.
func agreeOnSum(t testing.TB, procs []*launch.Proc, pl plane, algo string, sizes []int) {
	t.Helper()
	var args []string
	for _, s := range sizes {
		args = append(args, strconv.Itoa(s))
	}
	tell(t, procs, "allreduce "+algo+" "+strings.Join(args, " "))
	var first string
	for _, p := range procs {
		line := expect(t, p, "ok")
		if first == "" {
			first = line
		} else if line != first {
			t.Fatalf("world %d %s: rank %d got %q, the first rank %q: the ranks reduced in different orders", len(procs), algo, p.Rank, line, first)
		}
	}
	for i, size := range sizes {
		inputs := make([][]float32, len(procs))
		for r := range procs {
			inputs[r] = childInput(r, size)
		}
		if size >= 13 && len(procs) > 2 && !ordersDiffer(inputs) {
			t.Fatalf("size %d: the inputs sum to the same bits in rank order and in reverse: they cannot catch a change of order", size)
		}
		h := sha256.Sum256(bytesOf(reduceInOrder(pl, algo, inputs, size)))
		if got := strings.Fields(first)[1+i]; got != hex.EncodeToString(h[:8]) {
			t.Errorf("world %d %s (%+v), size %d: result differs from the sum in the algorithm's order", len(procs), algo, pl, size)
		}
	}
}

// ordersDiffer reports whether summing inputs in rank order and in reverse
// gives different float32 bits for some element.
func ordersDiffer(inputs [][]float32) bool {
	for i := range inputs[0] {
		var fwd, rev float32
		for r := range inputs {
			fwd += inputs[r][i]
			rev += inputs[len(inputs)-1-r][i]
		}
		if math.Float32bits(fwd) != math.Float32bits(rev) {
			return true
		}
	}
	return false
}
