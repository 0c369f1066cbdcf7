package collective

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/internal/netns"
)

// TestHierProcessesNetns: three network namespaces as hosts, two rank
// processes in each, TransportAuto: shared memory inside a host, TCP across,
// the hierarchical allreduce. Results agree bit for bit and equal the sum; a
// killed rank is reported as ErrPeerLost by every survivor; the survivors
// rebuild generation 2 and agree again; no segment file is left.
func TestHierProcessesNetns(t *testing.T) {
	const hostsN, perHost = 3, 2
	lab := netns.Start(t, hostsN)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := hostsN * perHost
	hosts := make([]string, n)
	for r := range hosts {
		hosts[r] = fmt.Sprintf("ns%d", r/perHost)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	startCtx, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	procs, err := launch.Start(startCtx, n, func(rank int) *exec.Cmd {
		h := lab.Host(rank / perHost)
		cmd := h.Command(ctx, exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("PHALANX_TEST_RANK=%d", rank), "PHALANX_TEST_TIMEOUT=30s",
			"PHALANX_TEST_TRANSPORT=auto", "PHALANX_TEST_SHM_DIR="+dir,
			"PHALANX_TEST_BIND="+h.Addr().String()+":0", "PHALANX_TEST_HOSTS="+strings.Join(hosts, ","))
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

	sizes := []int{1, 4099, 1<<18 + 5}
	agreeOnSum(t, procs, sizes)

	// Kill a rank mid-loop: every survivor names it.
	const victim = 3
	tell(t, procs, "loop 262144")
	for _, p := range procs {
		expect(t, p, "looping")
	}
	if err := procs[victim].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var survivors []*launch.Proc
	var addrs, survHosts []string
	for _, p := range procs {
		if p.Rank == victim {
			continue
		}
		line := expect(t, p, "err")
		if f := strings.Fields(line); f[1] != "peer-lost" || f[2] != strconv.Itoa(victim) {
			t.Errorf("rank %d: %q, want peer-lost naming rank %d", p.Rank, line, victim)
		}
		survivors = append(survivors, p)
		addrs = append(addrs, p.Addr)
		survHosts = append(survHosts, hosts[p.Rank])
	}
	for i, p := range survivors {
		fmt.Fprintf(p.In, "rejoin 2 %d %s %s\n", i, strings.Join(addrs, ","), strings.Join(survHosts, ","))
	}
	for _, p := range survivors {
		expect(t, p, "joined")
	}
	agreeOnSum(t, survivors, sizes)
	if files := shmFiles(t, dir); len(files) != 0 {
		t.Fatalf("segment files left: %v", files)
	}
}

// agreeOnSum runs an allreduce of each size on procs and checks that every
// rank got the same bits, equal to the sum of childInput.
func agreeOnSum(t *testing.T, procs []*launch.Proc, sizes []int) {
	t.Helper()
	var args []string
	for _, s := range sizes {
		args = append(args, strconv.Itoa(s))
	}
	tell(t, procs, "allreduce auto "+strings.Join(args, " "))
	var first string
	for _, p := range procs {
		line := expect(t, p, "ok")
		if first == "" {
			first = line
		} else if line != first {
			t.Fatalf("rank %d got %q, the first rank %q", p.Rank, line, first)
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
			t.Errorf("size %d: result differs from the sum", size)
		}
	}
}
