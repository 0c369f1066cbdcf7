package main

import (
	"context"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/phalanx-rt/phalanx/bench"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
	"github.com/phalanx-rt/phalanx/pki"
	"github.com/phalanx-rt/phalanx/ps"
)

// benchCmd is phalanx bench: figures measured against a reference taken
// in the same run.
func benchCmd(stdout, stderr io.Writer) *cobra.Command {
	return group("bench", "figures measured against a reference in the same run",
		"Measures Phalanx's figures against a reference taken in the same run.", "benchmark", stderr,
		benchAllReduce(stdout, stderr), benchTCP(stdout), benchCheckpoint(stdout), benchPS(stdout))
}

func benchAllReduce(stdout, stderr io.Writer) *cobra.Command {
	cmd := leaf("allreduce", "allreduce figures over N local processes (nccl-tests style)",
		"Measures float32 sum-allreduce over --ranks ranks: with --transport tcp, shm or auto, one OS process per\n"+
			"rank (on 127.0.0.1, or through shared memory); with inproc, goroutines in this process. For every size it prints the median over the\n"+
			"iterations of the slowest rank's time, algbw = bytes/time and busbw = algbw·2(N−1)/N; with --json also\n"+
			"the algorithm asked for (algo) and the one that ran (algorithm). With --tls on or compare the rank processes\n"+
			"speak mutual TLS 1.3 (the cipher suite in the tls column or field); compare measures every size over a plaintext\n"+
			"and a TLS data plane of the same processes, their timed iterations alternating, and prints the TLS/plaintext busbw ratio.")
	fs := cmd.Flags()
	cfg := bench.AllReduceConfig{Stderr: stderr}
	fs.IntVar(&cfg.Ranks, "ranks", 4, "number of ranks (1..64)")
	sizes := fs.String("sizes", "4KiB,64KiB,1MiB,16MiB,64MiB", "comma-separated message sizes in bytes (units B, KiB, MiB, GiB)")
	fs.StringVar(&cfg.Transport, "transport", "tcp", "data plane: tcp, shm (shared memory) or auto (shared memory here: every rank is on this host),\none process per rank each; or inproc (goroutines)")
	algo := fs.String("algo", "auto", "allreduce algorithm: ring, tree (recursive doubling, alias rd), single-copy or auto (by size);\nover shm, and auto's shared memory, single-copy replaces ring and rd: --json's algorithm says what ran")
	fs.IntVar(&cfg.Iters, "iters", 0, "timed iterations per size; 0 picks by size (at least 20, about 256 MiB moved)")
	fs.IntVar(&cfg.Warmup, "warmup", 5, "untimed iterations per size")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Minute, "per-operation timeout")
	segment := fs.String("segment", "1MiB", "ring pipelining segment size")
	fs.IntVar(&cfg.Threads, "threads", 0, "with a process transport: OS threads running Go code in each rank process (GOMAXPROCS);\n0 = this machine's cores divided by --ranks, at least 1")
	jsonOut := fs.Bool("json", false, "print one JSON object per size and nothing else on stdout")
	asRank := fs.Int("as-rank", -1, "internal: run as this rank of a benchmark launched by phalanx itself")
	fs.StringVar(&cfg.Bind, "bind", "127.0.0.1:0", "with --as-rank: data-plane listen address")
	fs.StringVar(&cfg.TLS, "tls", bench.TLSOff, "with --transport tcp: off, on (mutual TLS 1.3 between the rank processes, from an ephemeral CA\nwith a certificate per rank) or compare (every size plaintext and with TLS, iterations alternating, and the ratio of their busbw)")
	fs.StringVar(&cfg.TLSFiles.CA, "tls-ca", "", "internal, with --as-rank: the CA of the rank's TLS")
	fs.StringVar(&cfg.TLSFiles.Cert, "tls-cert", "", "internal, with --as-rank: the rank's certificate")
	fs.StringVar(&cfg.TLSFiles.Key, "tls-key", "", "internal, with --as-rank: the rank's key")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	for _, f := range []string{"as-rank", "tls-ca", "tls-cert", "tls-key"} {
		if err := fs.MarkHidden(f); err != nil {
			panic(err)
		}
	}
	completeValues(cmd, "transport", "tcp", "shm", "auto", "inproc")
	completeValues(cmd, "algo", "auto", "ring", "tree", "single-copy")
	completeValues(cmd, "tls", bench.TLSOff, bench.TLSOn, bench.TLSCompare)
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		var err error
		if cfg.Ranks < 1 || cfg.Ranks > 64 {
			return usagef("--ranks %d: want 1..64", cfg.Ranks)
		}
		if cfg.Sizes, err = bytesize.ParseList(*sizes, 4); err != nil {
			return usagef("--sizes: %v", err)
		}
		if cfg.Algorithm, err = collective.ParseAlgorithm(*algo); err != nil {
			return usagef("--algo: %v", err)
		}
		switch cfg.Transport {
		case bench.TransportTCP, bench.TransportShm, bench.TransportAuto, bench.TransportInproc:
		default:
			return usagef("--transport %q: want tcp, shm, auto or inproc", cfg.Transport)
		}
		if cfg.SegmentBytes, err = bytesize.Parse(*segment); err != nil || cfg.SegmentBytes < 64 {
			return usagef("--segment %q: want a size of at least 64 bytes", *segment)
		}
		if cfg.Threads < 0 {
			return usagef("--threads %d: must not be negative", cfg.Threads)
		}
		if cfg.Iters < 0 || cfg.Warmup < 0 {
			return usagef("--iters and --warmup must not be negative")
		}
		switch cfg.TLS {
		case bench.TLSOff:
		case bench.TLSOn, bench.TLSCompare:
			if cfg.Transport != bench.TransportTCP {
				return usagef("--tls %s: only with --transport tcp (shared memory never leaves this host)", cfg.TLS)
			}
		default:
			return usagef("--tls %q: want off, on or compare", cfg.TLS)
		}
		if cfg.Logger, err = newLogger(*logLevel, stderr); err != nil {
			return err
		}
		defer cfg.Logger.Sync()
		if *asRank >= 0 {
			return bench.AllReduceRank(ctx, cfg, *asRank, os.Stdin, stdout)
		}
		// Each rank is this binary again, with these flags and its rank.
		given := []string{"bench", "allreduce"}
		fs.Visit(func(f *pflag.Flag) { given = append(given, "--"+f.Name+"="+f.Value.String()) })
		cfg.RankArgs = func(rank int, tls pki.Files) []string {
			args := append(slices.Clip(given), "--as-rank", strconv.Itoa(rank))
			if tls.Enabled() {
				args = append(args, "--tls-ca", tls.CA, "--tls-cert", tls.Cert, "--tls-key", tls.Key)
			}
			return args
		}
		return bench.WriteAllReduce(ctx, cfg, bench.Output{W: stdout, JSON: *jsonOut})
	})
}

func benchTCP(stdout io.Writer) *cobra.Command {
	cmd := leaf("tcp", "raw single-stream loopback TCP throughput, the reference line",
		"Measures the raw single-stream TCP throughput of 127.0.0.1 on this machine (one sender and one\n"+
			"receiver goroutine, 4 MiB writes): the reference line for the data plane's figures.")
	fs := cmd.Flags()
	dur := fs.Duration("duration", 3*time.Second, "how long to stream")
	chunk := fs.String("write", "4MiB", "size of each write")
	jsonOut := fs.Bool("json", false, "print one JSON object and nothing else")
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		wsize, err := bytesize.Parse(*chunk)
		if err != nil || wsize <= 0 {
			return usagef("--write %q: want a positive size", *chunk)
		}
		if *dur <= 0 {
			return usagef("--duration must be positive")
		}
		return bench.WriteTCP(ctx, bench.TCPConfig{Duration: *dur, WriteBytes: wsize}, bench.Output{W: stdout, JSON: *jsonOut})
	})
}

func benchCheckpoint(stdout io.Writer) *cobra.Command {
	cmd := leaf("checkpoint", "checkpoint save, stall and resume figures against plain minio-go",
		"Measures checkpoint figures against plain minio-go on the same MinIO, in the same run: upload\n"+
			"throughput of a sharded save (--ranks ranks in this process, each storing its share) against one\n"+
			"PutObject of the same bytes; the training stall of an asynchronous checkpoint against one memcpy of\n"+
			"the state; and a restore into every rank (read, verify, gather over the data plane) against one\n"+
			"GetObject. Credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY. Each figure is the median\n"+
			"of --repeat runs. bench/checkpoint.sh starts a MinIO and runs this.")
	fs := cmd.Flags()
	url := fs.String("checkpoint", "", "an s3:// location to measure in (a prefix that may be filled and emptied)")
	sizesText := fs.String("sizes", "64MiB,512MiB", "state sizes")
	ranks := fs.Int("ranks", 4, "ranks saving and restoring")
	repeat := fs.Int("repeat", 3, "runs per figure (the median is reported)")
	jsonOut := fs.Bool("json", false, "print JSON lines instead of a table")
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		sizes, err := bytesize.ParseList(*sizesText, 4)
		switch {
		case err != nil:
			return usagef("--sizes: %v", err)
		case *ranks < 1 || *ranks > 64 || *repeat < 1:
			return usagef("--ranks 1..64 and --repeat >= 1")
		}
		loc, err := checkpoint.ParseLocation(*url)
		if err != nil || loc.S3 == nil {
			return usagef("--checkpoint: want an s3:// location (%v)", err)
		}
		s3 := *loc.S3
		s3.AccessKey, s3.SecretKey = os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
		cfg := bench.CheckpointConfig{S3: s3, Sizes: sizes, Ranks: *ranks, Repeat: *repeat}
		return bench.WriteCheckpoint(ctx, cfg, bench.Output{W: stdout, JSON: *jsonOut})
	})
}

func benchPS(stdout io.Writer) *cobra.Command {
	cmd := leaf("ps", "sparse push+pull throughput against raw loopback TCP",
		"Measures the parameter server's sparse push+pull throughput (bytes of row data moved per second):\n"+
			"workers pull then push random distinct keys of a 64-dim table split over shards, each hosted by a\n"+
			"server on 127.0.0.1, and compares it with one raw loopback TCP stream measured in the same run.")
	fs := cmd.Flags()
	var cfg bench.PSConfig
	fs.IntVar(&cfg.Workers, "workers", 2, "worker clients")
	fs.IntVar(&cfg.Shards, "shards", 2, "shards, one server each")
	fs.IntVar(&cfg.Replicas, "replicas", 0, "backups of each shard")
	fs.IntVar(&cfg.Keys, "keys", 4096, "keys per request")
	fs.IntVar(&cfg.Dim, "dim", 64, "floats per row")
	fs.IntVar(&cfg.KeySpace, "key-space", 1_000_000, "keys are drawn from 0..key-space-1")
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "how long to measure each")
	jsonOut := fs.Bool("json", false, "print one JSON object and nothing else")
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		switch {
		case cfg.Workers < 1 || cfg.Shards < 1 || cfg.Replicas < 0 || cfg.Replicas >= cfg.Shards:
			return usagef("--workers and --shards must be positive, --replicas below --shards")
		case cfg.Keys < 1 || cfg.Keys > cfg.KeySpace || cfg.Dim < 1 || cfg.Dim > ps.MaxDim:
			return usagef("--keys must be in 1..--key-space, --dim in 1..%d", ps.MaxDim)
		case cfg.Duration <= 0:
			return usagef("--duration must be positive")
		}
		return bench.WritePS(ctx, cfg, bench.Output{W: stdout, JSON: *jsonOut})
	})
}
