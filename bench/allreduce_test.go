package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/cpu"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/pki"
)

// rankArg makes this test binary a rank process of
// TestBenchAllReduce's TCP cases, the role `phalanx bench allreduce --as-rank`
// plays for the command.
const rankArg = "-phalanx-bench-rank="

func TestMain(m *testing.M) {
	for _, a := range os.Args[1:] {
		if v, ok := strings.CutPrefix(a, rankArg); ok {
			os.Exit(runTestRank(v))
		}
	}
	os.Exit(m.Run())
}

// runTestRank is one rank process: "ranks,rank,transport,tls", and in a
// TLS run ",ca,cert,key" (its files: the test's temporary paths have no
// comma).
func runTestRank(arg string) int {
	f := strings.Split(arg, ",")
	if len(f) != 4 && len(f) != 7 {
		fmt.Fprintf(os.Stderr, "bad %s%s\n", rankArg, arg)
		return 2
	}
	ranks, err1 := strconv.Atoi(f[0])
	rank, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "bad %s%s\n", rankArg, arg)
		return 2
	}
	cfg := processConfig(ranks, f[2], f[3])
	if len(f) == 7 {
		cfg.TLSFiles = pki.Files{CA: f[4], Cert: f[5], Key: f[6]}
	}
	// A rank outlives no test: one whose parent died before ending it
	// (go test's own timeout) gives up rather than waiting on.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := AllReduceRank(ctx, cfg, rank, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// processConfig is the configuration the process cases and their rank
// processes share, as the command's flags do.
func processConfig(ranks int, transport, tlsMode string) AllReduceConfig {
	return AllReduceConfig{Ranks: ranks, Sizes: []int{4 << 10, 256 << 10, 3 << 20}, Transport: transport, Iters: 3, Warmup: 1, Threads: 1, TLS: tlsMode,
		RankArgs: func(rank int, tls pki.Files) []string {
			arg := rankArg + strconv.Itoa(ranks) + "," + strconv.Itoa(rank) + "," + transport + "," + tlsMode
			if tls.Enabled() {
				arg += "," + tls.CA + "," + tls.Cert + "," + tls.Key
			}
			return []string{arg}
		},
		Stderr: os.Stderr}
}

func TestBenchAllReduce(t *testing.T) {
	inproc := func(ranks int, algo collective.Algorithm) AllReduceConfig {
		return AllReduceConfig{Ranks: ranks, Sizes: []int{4 << 10, 1 << 20}, Transport: TransportInproc, Algorithm: algo, Iters: 3, Warmup: 1}
	}
	// ran is the algorithm each size runs: inproc's sizes are 4 KiB and 1 MiB,
	// the process cases' 4 KiB, 256 KiB and 3 MiB; auto is recursive doubling
	// up to 64 KiB and the ring above, single-copy on shared memory.
	cases := []struct {
		name string
		cfg  AllReduceConfig
		ran  []string
	}{
		{"inproc 1 rank", inproc(1, collective.AlgoAuto), []string{"rd", "ring"}},
		{"inproc 3 ranks auto", inproc(3, collective.AlgoAuto), []string{"rd", "ring"}},
		{"inproc 4 ranks ring", inproc(4, collective.AlgoRing), []string{"ring", "ring"}},
		{"inproc 3 ranks rd", inproc(3, collective.AlgoRecursiveDoubling), []string{"rd", "rd"}},
		{"tcp 2 rank processes", processConfig(2, TransportTCP, TLSOff), []string{"rd", "ring", "ring"}},
		{"tcp 3 rank processes", processConfig(3, TransportTCP, TLSOff), []string{"rd", "ring", "ring"}},
		{"shm 4 rank processes", processConfig(4, TransportShm, TLSOff), []string{"single-copy", "single-copy", "single-copy"}},
		{"auto 3 rank processes", processConfig(3, TransportAuto, TLSOff), []string{"single-copy", "single-copy", "single-copy"}},
		{"tcp 2 rank processes over TLS", processConfig(2, TransportTCP, TLSOn), []string{"rd", "ring", "ring"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []AllReduceResult
			ctx := testContext(t)
			if err := AllReduce(ctx, tc.cfg, func(r AllReduceResult) { got = append(got, r) }); err != nil {
				if ctx.Err() != nil { // a rank process killed at the deadline says only "signal: killed"
					t.Fatalf("waited %v for the benchmark: %v", testWait, err)
				}
				t.Fatal(err)
			}
			if len(got) != len(tc.cfg.Sizes) {
				t.Fatalf("got %d results for %d sizes: %+v", len(got), len(tc.cfg.Sizes), got)
			}
			n := float64(tc.cfg.Ranks)
			for i, r := range got {
				if r.Op != "allreduce" || r.Ranks != tc.cfg.Ranks || r.Bytes != tc.cfg.Sizes[i] || r.Transport != tc.cfg.Transport ||
					r.Algo != tc.cfg.Algorithm.String() || r.Iters != 3 || r.MedianS <= 0 || r.AlgBW <= 0 {
					t.Errorf("result %d: %+v", i, r)
				}
				if r.Algorithm != tc.ran[i] {
					t.Errorf("result %d (%d bytes): algorithm %q ran, want %q", i, r.Bytes, r.Algorithm, tc.ran[i])
				}
				if want := r.AlgBW * 2 * (n - 1) / n; r.BusBW < want*0.999 || r.BusBW > want*1.001 {
					t.Errorf("busbw %v is not algbw·2(N−1)/N = %v", r.BusBW, want)
				}
				if want := wantSuite(tc.cfg.TLS); r.TLS != want {
					t.Errorf("result %d: cipher suite %q, want %q", i, r.TLS, want)
				}
			}
		})
	}
}

// wantSuite is the cipher suite a result of a run in TLS mode names: TLS
// 1.3's AES-128-GCM on a CPU with AES-NI (crypto/tls's first choice
// then), none in plaintext.
func wantSuite(mode string) string {
	switch {
	case mode == "" || mode == TLSOff:
		return ""
	case runtime.GOARCH == "amd64" && !(cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ):
		return "TLS_CHACHA20_POLY1305_SHA256"
	}
	return "TLS_AES_128_GCM_SHA256"
}

// TestBenchAllReduceTLSCompare: --tls compare measures every size over
// a plaintext and a TLS data plane of the same rank processes, a row for
// each, and ends the table with the TLS/plaintext busbw ratio of each.
func TestBenchAllReduceTLSCompare(t *testing.T) {
	cfg := processConfig(2, TransportTCP, TLSCompare)
	var out bytes.Buffer
	if err := WriteAllReduce(testContext(t), cfg, Output{W: &out}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	n := len(cfg.Sizes)
	if len(lines) != 3+3*n || !strings.HasPrefix(lines[1], "# mutual TLS 1.3 (compare); this CPU has AES-NI: ") {
		t.Fatalf("want 3 comment lines, %d pairs of rows and %d ratios:\n%s", n, n, out.String())
	}
	busbw := make([]float64, 2*n) // each size's plaintext row's, then its TLS row's
	for i, l := range lines[3 : 3+2*n] {
		f := strings.Fields(l)
		wantTLS := "-"
		if i%2 == 1 {
			wantTLS = wantSuite(TLSOn)
		}
		if len(f) != 7 || f[0] != strconv.Itoa(cfg.Sizes[i/2]) || f[6] != wantTLS {
			t.Fatalf("row %d %q: want %d bytes, tls %s", i, l, cfg.Sizes[i/2], wantTLS)
		}
		busbw[i], _ = strconv.ParseFloat(f[5], 64)
	}
	for i, l := range lines[3+2*n:] {
		var size int
		var ratio float64
		// The rows print busbw to 0.0005 GB/s.
		p, q := busbw[2*i], busbw[2*i+1]
		lo, hi := (q-5e-4)/(p+5e-4), (q+5e-4)/max(p-5e-4, 1e-9)
		if _, err := fmt.Sscanf(l, "# TLS/plaintext busbw at %d B: %g", &size, &ratio); err != nil || size != cfg.Sizes[i] || ratio < lo-5e-4 || ratio > hi+5e-4 {
			t.Errorf("ratio line %q (%v): want the ratio of %d bytes' busbw, %v/%v", l, err, cfg.Sizes[i], q, p)
		}
	}
}

func TestBenchAllReduceConfigErrors(t *testing.T) {
	good := AllReduceConfig{Ranks: 2, Sizes: []int{4096}, Transport: TransportInproc}
	cases := []struct {
		name string
		edit func(c *AllReduceConfig)
		want string
	}{
		{"no ranks", func(c *AllReduceConfig) { c.Ranks = 0 }, "0 ranks"},
		{"no sizes", func(c *AllReduceConfig) { c.Sizes = nil }, "no sizes"},
		{"odd size", func(c *AllReduceConfig) { c.Sizes = []int{4096, 6} }, "size 6"},
		{"transport", func(c *AllReduceConfig) { c.Transport = "udp" }, `transport "udp"`},
		{"negative warmup", func(c *AllReduceConfig) { c.Warmup = -1 }, "negative"},
		{"tcp without RankArgs", func(c *AllReduceConfig) { c.Transport = TransportTCP }, "RankArgs"},
		{"TLS in process", func(c *AllReduceConfig) { c.TLS = TLSOn }, "TLS is the TCP transport's"},
		{"TLS over shm", func(c *AllReduceConfig) { c.TLS, c.Transport = TLSCompare, TransportShm }, "not shm's"},
		{"TLS mode", func(c *AllReduceConfig) { c.TLS = "yes" }, `TLS "yes"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.edit(&cfg)
			err := AllReduce(testContext(t), cfg, func(AllReduceResult) { t.Error("reported a result") })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestBenchWriteAllReduce checks both printed forms: the table has two
// comment lines and one row per size; JSON has one object per size and
// nothing else.
func TestBenchWriteAllReduce(t *testing.T) {
	cfg := AllReduceConfig{Ranks: 2, Sizes: []int{4 << 10, 64 << 10, 1 << 20}, Transport: TransportInproc, Iters: 2}
	for _, jsonOut := range []bool{false, true} {
		t.Run(fmt.Sprintf("json=%v", jsonOut), func(t *testing.T) {
			var out bytes.Buffer
			if err := WriteAllReduce(testContext(t), cfg, Output{W: &out, JSON: jsonOut}); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if !jsonOut {
				if len(lines) != 2+len(cfg.Sizes) || !strings.HasPrefix(lines[0], "# phalanx allreduce: 2 ranks, transport inproc, algo auto") {
					t.Fatalf("table:\n%s", out.String())
				}
				if f := strings.Fields(lines[3]); len(f) != 6 || f[0] != "65536" || f[1] != "16384" || f[2] != "2" {
					t.Errorf("row %q", lines[3])
				}
				return
			}
			if len(lines) != len(cfg.Sizes) {
				t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(cfg.Sizes), out.String())
			}
			for i, l := range lines {
				var r AllReduceResult
				if err := json.Unmarshal([]byte(l), &r); err != nil || r.Bytes != cfg.Sizes[i] {
					t.Errorf("line %d %q: %+v, %v", i, l, r, err)
				}
			}
		})
	}
}
