package collective

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
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
	ctx := context.Background()
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

// childInput is rank r's deterministic input of n elements.
func childInput(r, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32((r+1)*(i%13)) * 0.25
	}
	return x
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
			agreeOnSum(t, procs, algo, sizes)
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
	rebuild(t, survivors)
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
	rebuild(t, survivors)
	if err := victim.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	expect(t, victim, "err")
}

// rebuild joins the survivors as generation 2 (ranks renumbered in order, same
// ports) and checks an allreduce.
func rebuild(t *testing.T, survivors []*launch.Proc) {
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
	tell(t, survivors, "allreduce auto 1000 300000")
	var first string
	for _, p := range survivors {
		line := expect(t, p, "ok")
		if first != "" && line != first {
			t.Fatalf("generation 2 ranks disagree: %q vs %q", line, first)
		}
		first = line
	}
	want := make([]float32, 1000)
	for r := range survivors {
		for j, v := range childInput(r, 1000) {
			want[j] += v
		}
	}
	h := sha256.Sum256(bytesOf(want))
	if got := strings.Fields(first)[1]; got != hex.EncodeToString(h[:8]) {
		t.Errorf("generation 2 allreduce differs from the sum")
	}
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
		agreeOnSum(t, procs, algo, sizes)
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
	rebuild(t, survivors)
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
	rebuild(t, survivors)
	if err := victim.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	expect(t, victim, "err")
	if files := shmFiles(t, dir); len(files) != 0 {
		t.Fatalf("segment files left: %v", files)
	}
}

// agreeOnSum runs an allreduce of each size with algo on procs and checks
// that every rank got the same bits, equal to the sum of childInput.
func agreeOnSum(t testing.TB, procs []*launch.Proc, algo string, sizes []int) {
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
			t.Fatalf("world %d %s: rank %d got %q, the first rank %q", len(procs), algo, p.Rank, line, first)
		}
	}
	for i, size := range sizes {
		want := make([]float32, size)
		for r := range procs {
			for j, v := range childInput(r, size) {
				want[j] += v
			}
		}
		h := sha256.Sum256(bytesOf(want))
		if got := strings.Fields(first)[1+i]; got != hex.EncodeToString(h[:8]) {
			t.Errorf("world %d %s size %d: result differs from the sum", len(procs), algo, size)
		}
	}
}
