package collective

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

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
	dir := t.TempDir()
	procs, hosts := startNetnsRanks(t, lab, perHost, "auto", dir)
	tell(t, procs, "plane")
	for _, p := range procs {
		if line := expect(t, p, "plane"); planeOf(strings.TrimPrefix(line, "plane ")) != "hierarchical" {
			t.Fatalf("rank %d: %q, want the hierarchical allreduce", p.Rank, line)
		}
	}

	sizes := []int{1, 4099, 1<<18 + 5}
	agreeOnSum(t, procs, plane{hosts: hosts}, "auto", sizes)

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
	agreeOnSum(t, survivors, plane{hosts: survHosts}, "auto", sizes)
	if files := shmFiles(t, dir); len(files) != 0 {
		t.Fatalf("segment files left: %v", files)
	}
}

// startNetnsRanks starts perHost rank processes in each of lab's hosts, on
// the given transport, and returns them with the membership's host names.
func startNetnsRanks(t testing.TB, lab *netns.Lab, perHost int, transport, dir string) ([]*launch.Proc, []string) {
	t.Helper()
	n := lab.Len() * perHost
	hosts := make([]string, n)
	for r := range hosts {
		hosts[r] = fmt.Sprintf("ns%d", r/perHost)
	}
	procs := spawnRanks(t, n, func(ctx context.Context, rank int, exe string) *exec.Cmd {
		h := lab.Host(rank / perHost)
		cmd := h.Command(ctx, exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("PHALANX_TEST_RANK=%d", rank), "PHALANX_TEST_TIMEOUT=60s",
			"PHALANX_TEST_TRANSPORT="+transport, "PHALANX_TEST_SHM_DIR="+dir,
			"PHALANX_TEST_BIND="+h.Addr().String()+":0", "PHALANX_TEST_HOSTS="+strings.Join(hosts, ","))
		return cmd
	})
	return procs, hosts
}

// BenchmarkHierNetns: three network namespaces as hosts, two ranks in each;
// the busbw of the hierarchical allreduce (auto) against a flat TCP ring
// over the same six ranks (tcp). As root:
//
//	go test -run '^$' -bench HierNetns -benchtime 1x ./collective
func BenchmarkHierNetns(b *testing.B) {
	const hostsN, perHost, iters = 3, 2, 10
	for _, transport := range []string{"auto", "tcp"} {
		for _, size := range []int{1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("%s/%dMiB", transport, size>>20), func(b *testing.B) {
				lab := netns.Start(b, hostsN)
				procs, _ := startNetnsRanks(b, lab, perHost, transport, b.TempDir())
				n := len(procs)
				var worst float64
				for range b.N {
					tell(b, procs, fmt.Sprintf("time %d %d", size/4, iters))
					worst = 0
					for _, p := range procs {
						secs, err := strconv.ParseFloat(strings.Fields(expect(b, p, "time"))[1], 64)
						if err != nil {
							b.Fatal(err)
						}
						worst = max(worst, secs)
					}
				}
				b.ReportMetric(float64(size)/worst/1e9*2*float64(n-1)/float64(n), "busbw-GB/s")
				b.ReportMetric(worst*1e3, "ms/op")
			})
		}
	}
}
