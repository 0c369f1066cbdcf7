package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/launch"
)

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("bench: name what to measure: allreduce, tcp, checkpoint or ps")
	}
	switch args[0] {
	case "allreduce":
		return benchAllReduce(ctx, args[1:], stdout, stderr)
	case "tcp":
		return benchTCP(ctx, args[1:], stdout, stderr)
	case "checkpoint":
		return benchCheckpoint(ctx, args[1:], stdout, stderr)
	case "ps":
		return benchPS(ctx, args[1:], stdout, stderr)
	}
	return usagef("bench: unknown benchmark %q (want allreduce, tcp, checkpoint or ps)", args[0])
}

// allreduceResult is one line of the benchmark's JSON output.
type allreduceResult struct {
	Op        string  `json:"op"`
	Ranks     int     `json:"ranks"`
	Bytes     int     `json:"bytes"`
	Algo      string  `json:"algo"`
	Transport string  `json:"transport"`
	Iters     int     `json:"iters"`
	MedianS   float64 `json:"median_s"`
	AlgBW     float64 `json:"algbw_GBps"`
	BusBW     float64 `json:"busbw_GBps"`
}

type allreduceConfig struct {
	ranks     int
	sizes     []int
	transport string
	algo      collective.Algorithm
	iters     int
	warmup    int
	timeout   time.Duration
	segment   int
	jsonOut   bool
	asRank    int
	bind      string
	logLevel  string
	threads   int
	rawArgs   []string
}

func benchAllReduce(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench allreduce",
		"Measures float32 sum-allreduce over --ranks ranks: with --transport tcp, one OS process per rank on\n"+
			"127.0.0.1; with inproc, goroutines in this process. For every size it prints the median over the\n"+
			"iterations of the slowest rank's time, algbw = bytes/time and busbw = algbw·2(N−1)/N.", stderr)
	var c allreduceConfig
	fs.IntVar(&c.ranks, "ranks", 4, "number of ranks (1..64)")
	sizes := fs.String("sizes", "4KiB,64KiB,1MiB,16MiB,64MiB", "comma-separated message sizes in bytes (units B, KiB, MiB, GiB)")
	fs.StringVar(&c.transport, "transport", "tcp", "data plane: tcp (one process per rank) or inproc (goroutines)")
	algo := fs.String("algo", "auto", "allreduce algorithm: ring, tree (recursive doubling, alias rd) or auto (by size)")
	fs.IntVar(&c.iters, "iters", 0, "timed iterations per size; 0 picks by size (at least 20, about 256 MiB moved)")
	fs.IntVar(&c.warmup, "warmup", 5, "untimed iterations per size")
	fs.DurationVar(&c.timeout, "timeout", time.Minute, "per-operation timeout")
	segment := fs.String("segment", "1MiB", "ring pipelining segment size")
	fs.IntVar(&c.threads, "threads", 0, "with --transport tcp: OS threads running Go code in each rank process (GOMAXPROCS);\n0 = this machine's cores divided by --ranks, at least 1")
	fs.BoolVar(&c.jsonOut, "json", false, "print one JSON object per size and nothing else on stdout")
	fs.IntVar(&c.asRank, "as-rank", -1, "internal: run as this rank of a benchmark launched by phalanx itself")
	fs.StringVar(&c.bind, "bind", "127.0.0.1:0", "with --as-rank: data-plane listen address")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var err error
	if c.ranks < 1 || c.ranks > 64 {
		return usagef("--ranks %d: want 1..64", c.ranks)
	}
	if c.sizes, err = parseSizes(*sizes, 4); err != nil {
		return usagef("--sizes: %v", err)
	}
	if c.algo, err = collective.ParseAlgorithm(*algo); err != nil {
		return usagef("--algo: %v", err)
	}
	if c.transport != "tcp" && c.transport != "inproc" {
		return usagef("--transport %q: want tcp or inproc", c.transport)
	}
	if c.segment, err = parseSize(*segment); err != nil || c.segment < 64 {
		return usagef("--segment %q: want a size of at least 64 bytes", *segment)
	}
	if c.threads < 0 {
		return usagef("--threads %d: must not be negative", c.threads)
	}
	if c.iters < 0 || c.warmup < 0 {
		return usagef("--iters and --warmup must not be negative")
	}
	c.rawArgs = args
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()

	if c.asRank >= 0 {
		return benchRankProcess(ctx, c, stdout, log)
	}
	results := make(chan allreduceResult)
	errc := make(chan error, 1)
	go func() {
		defer close(results)
		if c.transport == "inproc" {
			errc <- benchInproc(ctx, c, results, log)
		} else {
			errc <- benchProcesses(ctx, c, results, stderr)
		}
	}()
	if !c.jsonOut {
		fmt.Fprintf(stdout, "# phalanx allreduce: %d ranks, transport %s, algo %s, float32 sum\n", c.ranks, c.transport, c.algo)
		fmt.Fprintf(stdout, "# %12s %12s %7s %12s %12s %12s\n", "size(B)", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)")
	}
	enc := json.NewEncoder(stdout)
	for r := range results {
		if c.jsonOut {
			enc.Encode(r)
			continue
		}
		fmt.Fprintf(stdout, "  %12d %12d %7d %12.1f %12.3f %12.3f\n", r.Bytes, r.Bytes/4, r.Iters, r.MedianS*1e6, r.AlgBW, r.BusBW)
	}
	return <-errc
}

func itersFor(c allreduceConfig, size int) int {
	if c.iters > 0 {
		return c.iters
	}
	return min(max(20, (256<<20)/max(size, 1)), 1000)
}

// benchRank runs the measurement on one rank; rank 0 reports each size.
func benchRank(ctx context.Context, g *collective.Group, c allreduceConfig, report func(allreduceResult)) error {
	maxSize := slices.Max(c.sizes)
	x := make([]float32, maxSize/4)
	n := g.Size()
	for _, size := range c.sizes {
		buf := collective.Float32s(x[:size/4])
		// Correctness first: every rank contributes rank+1.
		for i := range x[:size/4] {
			x[i] = float32(g.Rank() + 1)
		}
		if err := g.AllReduceWith(ctx, buf, collective.Sum, c.algo); err != nil {
			return err
		}
		want := float32(n * (n + 1) / 2)
		for i, v := range x[:size/4] {
			if v != want {
				return fmt.Errorf("allreduce of %d bytes: element %d = %v, want %v", size, i, v, want)
			}
		}
		clear(x[:size/4])
		for range c.warmup {
			if err := g.AllReduceWith(ctx, buf, collective.Sum, c.algo); err != nil {
				return err
			}
		}
		iters := itersFor(c, size)
		times := make([]float64, iters)
		for it := range times {
			if err := g.Barrier(ctx); err != nil {
				return err
			}
			t0 := time.Now()
			if err := g.AllReduceWith(ctx, buf, collective.Sum, c.algo); err != nil {
				return err
			}
			times[it] = time.Since(t0).Seconds()
		}
		// The slowest rank's time of each iteration, through the group itself.
		if err := g.AllReduce(ctx, collective.Float64s(times), collective.Max); err != nil {
			return err
		}
		if g.Rank() == 0 {
			slices.Sort(times)
			med := times[len(times)/2]
			if len(times)%2 == 0 {
				med = (times[len(times)/2-1] + times[len(times)/2]) / 2
			}
			algbw := float64(size) / med / 1e9
			report(allreduceResult{Op: "allreduce", Ranks: n, Bytes: size, Algo: c.algo.String(), Transport: c.transport,
				Iters: iters, MedianS: med, AlgBW: algbw, BusBW: algbw * 2 * float64(n-1) / float64(n)})
		}
	}
	return nil
}

func groupOptions(c allreduceConfig, log *zap.Logger) collective.Options {
	return collective.Options{Timeout: c.timeout, SegmentBytes: c.segment, Algorithm: c.algo, Logger: log}
}

func benchInproc(ctx context.Context, c allreduceConfig, out chan<- allreduceResult, log *zap.Logger) error {
	network := collective.NewInprocNetwork()
	peers := make([]string, c.ranks)
	for i := range peers {
		peers[i] = "rank-" + strconv.Itoa(i)
	}
	errs := make([]error, c.ranks)
	var wg sync.WaitGroup
	for r := range c.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := collective.Join(ctx, network, collective.Membership{Job: "bench", Generation: 1, Rank: r, Peers: peers}, groupOptions(c, log))
			if err != nil {
				errs[r] = err
				return
			}
			defer g.Close()
			errs[r] = benchRank(ctx, g, c, func(res allreduceResult) { out <- res })
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// benchProcesses starts one process per rank and relays rank 0's results.
func benchProcesses(ctx context.Context, c allreduceConfig, out chan<- allreduceResult, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	procs, err := launch.Start(startCtx, c.ranks, func(rank int) *exec.Cmd {
		args := append([]string{"bench", "allreduce"}, c.rawArgs...)
		args = append(args, "--as-rank", strconv.Itoa(rank))
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stderr = stderr
		return cmd
	})
	if err != nil {
		return err
	}
	defer launch.Kill(procs)
	sc := bufio.NewScanner(procs[0].Out)
	for sc.Scan() {
		var r allreduceResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("rank 0 printed %q: %w", sc.Text(), err)
		}
		out <- r
	}
	var failed error
	for _, p := range procs {
		p.In.Close()
		if err := p.Cmd.Wait(); err != nil && failed == nil {
			failed = fmt.Errorf("rank %d (pid %d): %w", p.Rank, p.Pid(), err)
		}
	}
	return failed
}

// benchRankProcess is one rank of benchProcesses.
func benchRankProcess(ctx context.Context, c allreduceConfig, stdout io.Writer, log *zap.Logger) error {
	runtime.GOMAXPROCS(launch.ThreadsPerRank(c.threads, c.ranks))
	tr, err := collective.ListenTCP(collective.TCPOptions{Bind: c.bind, Logger: log})
	if err != nil {
		return err
	}
	defer tr.Close()
	peers, err := launch.Announce(stdout, bufio.NewReader(os.Stdin), tr.Addr())
	if err != nil {
		return err
	}
	if len(peers) != c.ranks {
		return fmt.Errorf("launcher sent %d peers for %d ranks", len(peers), c.ranks)
	}
	g, err := collective.Join(ctx, tr, collective.Membership{Job: "bench", Generation: 1, Rank: c.asRank, Peers: peers}, groupOptions(c, log))
	if err != nil {
		return err
	}
	defer g.Close()
	enc := json.NewEncoder(stdout)
	return benchRank(ctx, g, c, func(r allreduceResult) { enc.Encode(r) })
}
