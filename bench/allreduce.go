package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/cpu"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/pki"
)

// Data planes of the allreduce benchmark.
const (
	TransportTCP    = "tcp"    // one process per rank on 127.0.0.1
	TransportShm    = "shm"    // one process per rank, shared memory between them
	TransportAuto   = "auto"   // one process per rank, collective.TransportAuto (all on this host: shared memory)
	TransportInproc = "inproc" // goroutines of this process over in-memory pipes
)

// TLS modes of the allreduce benchmark, over TransportTCP.
const (
	TLSOff     = "off"     // plaintext (also the empty string)
	TLSOn      = "on"      // mutual TLS between the rank processes
	TLSCompare = "compare" // every size plaintext and with TLS, iterations alternating, and the ratio of the two
)

// isProcessTransport reports whether t runs one process per rank.
func isProcessTransport(t string) bool {
	_, err := collective.ParseTransportKind(t)
	return err == nil
}

// AllReduceConfig is what the allreduce benchmark measures and how.
type AllReduceConfig struct {
	Ranks     int
	Sizes     []int  // message sizes in bytes, each a whole number of float32s
	Transport string // TransportTCP, TransportShm, TransportAuto or TransportInproc
	Algorithm collective.Algorithm
	// Iters is the number of timed iterations per size; 0 picks by size (at
	// least 20, about 256 MiB moved, at most 1000).
	Iters        int
	Warmup       int           // untimed iterations per size
	Timeout      time.Duration // per operation; 0 is collective's default
	SegmentBytes int           // ring pipelining segment; 0 is collective's default

	// With a process transport (all but TransportInproc): RankArgs(r) are the arguments with which this
	// executable (os.Executable) runs rank r, by calling AllReduceRank with
	// the same configuration. Threads is each rank process's GOMAXPROCS (0:
	// this machine's cores shared evenly), Bind its data-plane listen address
	// (default 127.0.0.1:0), and Stderr receives the rank processes' stderr
	// (nil discards it).
	// tls are rank r's TLS files in a TLS run (none otherwise), which the
	// rank process is to be given as TLSFiles.
	RankArgs func(rank int, tls pki.Files) []string
	Threads  int
	Bind     string
	Stderr   io.Writer

	// TLS is TLSOff, TLSOn or TLSCompare (TransportTCP alone: the other
	// planes never leave the host). With TLS the launcher makes an
	// ephemeral CA in a temporary directory, a certificate of it per rank,
	// and hands each rank process its files; TLSFiles are those files in
	// the rank process (set exactly when TLS is on or compared).
	TLS      string
	TLSFiles pki.Files

	Logger *zap.Logger // nil logs nothing
}

// AllReduceResult is one size's figures; its JSON form is one line of
// `phalanx bench allreduce --json`, which bench/reference.sh and
// bench/gloo_allreduce.py share.
type AllReduceResult struct {
	Op        string  `json:"op"` // "allreduce"
	Ranks     int     `json:"ranks"`
	Bytes     int     `json:"bytes"`
	Algo      string  `json:"algo"`      // the algorithm asked for (--algo), "auto" by default
	Algorithm string  `json:"algorithm"` // the one that ran (collective.Group.LastAlgorithm): rd, ring, single-copy or hierarchical
	Transport string  `json:"transport"`
	Iters     int     `json:"iters"`
	MedianS   float64 `json:"median_s"`   // over the iterations, of the slowest rank's time
	AlgBW     float64 `json:"algbw_GBps"` // bytes / time
	BusBW     float64 `json:"busbw_GBps"` // algbw · 2(N−1)/N, comparable across N
	// TLS is the cipher suite of a run over mutual TLS (TLS 1.3's
	// choice on this host, e.g. TLS_AES_128_GCM_SHA256), empty in plaintext.
	TLS string `json:"tls,omitempty"`
}

func (c AllReduceConfig) validate() error {
	switch {
	case c.Ranks < 1:
		return fmt.Errorf("bench: allreduce: %d ranks, want at least 1", c.Ranks)
	case len(c.Sizes) == 0:
		return errors.New("bench: allreduce: no sizes")
	case c.Transport != TransportInproc && !isProcessTransport(c.Transport):
		return fmt.Errorf("bench: allreduce: transport %q, want %q, %q, %q or %q", c.Transport, TransportTCP, TransportShm, TransportAuto, TransportInproc)
	case c.Iters < 0 || c.Warmup < 0 || c.Threads < 0:
		return errors.New("bench: allreduce: negative iterations, warmup or threads")
	case c.TLS != "" && c.TLS != TLSOff && c.TLS != TLSOn && c.TLS != TLSCompare:
		return fmt.Errorf("bench: allreduce: TLS %q, want %q, %q or %q", c.TLS, TLSOff, TLSOn, TLSCompare)
	case c.tls() && c.Transport != TransportTCP:
		return fmt.Errorf("bench: allreduce: TLS is the TCP transport's (shared memory and in-process pipes never leave this host), not %s's", c.Transport)
	}
	for _, s := range c.Sizes {
		if s < 0 || s%4 != 0 {
			return fmt.Errorf("bench: allreduce: size %d is not a whole number of float32s", s)
		}
	}
	return nil
}

// tls says whether TLS is asked for, alone or compared.
func (c AllReduceConfig) tls() bool { return c.TLS != "" && c.TLS != TLSOff }

func (c AllReduceConfig) iters(size int) int {
	if c.Iters > 0 {
		return c.Iters
	}
	return min(max(20, (256<<20)/max(size, 1)), 1000)
}

func (c AllReduceConfig) groupOptions() collective.Options {
	return collective.Options{Timeout: c.Timeout, SegmentBytes: c.SegmentBytes, Algorithm: c.Algorithm, Logger: c.Logger}
}

// AllReduce measures float32 sum-allreduce over cfg.Ranks ranks, one size
// after the other, and calls report with each size's figures in order, from
// one goroutine. With TLSCompare every size has two: plaintext, then TLS,
// measured by the same rank processes over two data planes, their timed
// iterations alternating so that the machine's other load weighs on both
// alike.
func AllReduce(ctx context.Context, cfg AllReduceConfig, report func(AllReduceResult)) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Transport == TransportInproc {
		return allreduceInproc(ctx, cfg, report)
	}
	return allreduceProcesses(ctx, cfg, report)
}

// WriteAllReduce runs AllReduce and prints each size's figures as
// `phalanx bench allreduce` does, as they come.
func WriteAllReduce(ctx context.Context, cfg AllReduceConfig, out Output) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	enc := json.NewEncoder(out.W)
	if !out.JSON {
		fmt.Fprintf(out.W, "# phalanx allreduce: %d ranks, transport %s, algo %s, float32 sum\n", cfg.Ranks, cfg.Transport, cfg.Algorithm)
		if cfg.tls() {
			fmt.Fprintf(out.W, "# mutual TLS 1.3 (%s); this CPU has AES-NI: %v, PCLMULQDQ: %v\n", cfg.TLS, cpu.X86.HasAES, cpu.X86.HasPCLMULQDQ)
			fmt.Fprintf(out.W, "# %12s %12s %7s %12s %12s %12s  %s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "tls")
		} else {
			fmt.Fprintf(out.W, "# %12s %12s %7s %12s %12s %12s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)")
		}
	}
	plain := map[int]float64{} // busbw by size, for TLSCompare's ratios
	var ratios []AllReduceResult
	err := AllReduce(ctx, cfg, func(r AllReduceResult) {
		if r.TLS == "" {
			plain[r.Bytes] = r.BusBW
		} else if _, ok := plain[r.Bytes]; ok {
			ratios = append(ratios, r)
		}
		switch {
		case out.JSON:
			enc.Encode(r)
		case cfg.tls():
			fmt.Fprintf(out.W, "  %12d %12d %7d %12.1f %12.3f %12.3f  %s\n", r.Bytes, r.Bytes/4, r.Iters, r.MedianS*1e6, r.AlgBW, r.BusBW, cmp.Or(r.TLS, "-"))
		default:
			fmt.Fprintf(out.W, "  %12d %12d %7d %12.1f %12.3f %12.3f\n", r.Bytes, r.Bytes/4, r.Iters, r.MedianS*1e6, r.AlgBW, r.BusBW)
		}
	})
	if !out.JSON {
		for _, r := range ratios {
			fmt.Fprintf(out.W, "# TLS/plaintext busbw at %d B: %.3f\n", r.Bytes, r.BusBW/plain[r.Bytes])
		}
	}
	return err
}

// allreduceInproc runs every rank as a goroutine of this process.
func allreduceInproc(ctx context.Context, cfg AllReduceConfig, report func(AllReduceResult)) error {
	groups, err := collective.InprocGroups(ctx, cfg.Ranks, "bench", 1, cfg.groupOptions())
	if err != nil {
		return fmt.Errorf("bench: allreduce: joining %d in-process ranks: %w", cfg.Ranks, err)
	}
	defer collective.CloseGroups(groups)
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = measureRank(ctx, []*collective.Group{g}, cfg, func(_ int, res AllReduceResult) { report(res) }); errs[r] != nil {
				g.Abort(errs[r].Error()) // the other ranks fail now, not at their timeout
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("bench: allreduce: rank %d: %w", r, err)
		}
	}
	return nil
}

// measureRank runs the measurement on one rank of each group of gs (one,
// or two over the same ranks, whose timed iterations alternate); rank 0
// reports each size's figures of each group in turn, with its index in gs.
func measureRank(ctx context.Context, gs []*collective.Group, cfg AllReduceConfig, report func(int, AllReduceResult)) error {
	x := make([]float32, slices.Max(cfg.Sizes)/4)
	n := gs[0].Size()
	for _, size := range cfg.Sizes {
		x := x[:size/4]
		buf := collective.Float32s(x)
		for _, g := range gs {
			// Correctness first: every rank contributes rank+1.
			for i := range x {
				x[i] = float32(g.Rank() + 1)
			}
			if err := g.AllReduceWith(ctx, buf, collective.Sum, cfg.Algorithm); err != nil {
				return err
			}
			want := float32(n * (n + 1) / 2)
			for i, v := range x {
				if v != want {
					return fmt.Errorf("allreduce of %d bytes: element %d = %v, want %v", size, i, v, want)
				}
			}
			clear(x)
			for range cfg.Warmup {
				if err := g.AllReduceWith(ctx, buf, collective.Sum, cfg.Algorithm); err != nil {
					return err
				}
			}
		}
		times := make([][]float64, len(gs))
		for i := range times {
			times[i] = make([]float64, cfg.iters(size))
		}
		for it := range cfg.iters(size) {
			for i, g := range gs {
				if err := g.Barrier(ctx); err != nil {
					return err
				}
				t0 := time.Now()
				if err := g.AllReduceWith(ctx, buf, collective.Sum, cfg.Algorithm); err != nil {
					return err
				}
				times[i][it] = time.Since(t0).Seconds()
			}
		}
		for i, g := range gs {
			ran := g.LastAlgorithm() // before the allreduce of the times below
			// The slowest rank's time of each iteration, through the group itself.
			if err := g.AllReduce(ctx, collective.Float64s(times[i]), collective.Max); err != nil {
				return err
			}
			if g.Rank() == 0 {
				med := median(times[i])
				algbw := float64(size) / med / 1e9
				report(i, AllReduceResult{Op: "allreduce", Ranks: n, Bytes: size, Algo: cfg.Algorithm.String(), Algorithm: ran.String(), Transport: cfg.Transport,
					Iters: len(times[i]), MedianS: med, AlgBW: algbw, BusBW: algbw * 2 * float64(n-1) / float64(n)})
			}
		}
	}
	return nil
}
