package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/launch"
	"github.com/phalanx-rt/phalanx/pki"
)

// allreduceProcesses starts one process per rank and relays rank 0's results.
func allreduceProcesses(ctx context.Context, cfg AllReduceConfig, report func(AllReduceResult)) error {
	if cfg.RankArgs == nil {
		return fmt.Errorf("bench: allreduce over %s needs RankArgs to start its rank processes", cfg.Transport)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench: allreduce: finding this executable: %w", err)
	}
	files := make([]pki.Files, cfg.Ranks)
	if cfg.tls() {
		dir, err := os.MkdirTemp("", "phalanx-bench-tls-")
		if err != nil {
			return fmt.Errorf("bench: allreduce: a directory for the ephemeral CA: %w", err)
		}
		defer os.RemoveAll(dir)
		hosts := make([]string, cfg.Ranks)
		for r := range hosts {
			hosts[r] = fmt.Sprintf("rank%d", r)
		}
		if files, err = pki.Init(dir, pki.InitOptions{Job: benchJob, Hosts: hosts, Now: time.Now(), Validity: 24 * time.Hour}); err != nil {
			return fmt.Errorf("bench: allreduce: the ephemeral CA: %w", err)
		}
	}
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	procs, err := launch.Start(startCtx, cfg.Ranks, func(rank int) *exec.Cmd {
		cmd := exec.CommandContext(ctx, exe, cfg.RankArgs(rank, files[rank])...)
		cmd.Stderr = cfg.Stderr
		return cmd
	})
	if err != nil {
		return fmt.Errorf("bench: allreduce: %w", err)
	}
	defer launch.Kill(procs)
	sc := bufio.NewScanner(procs[0].Out)
	for sc.Scan() {
		var r AllReduceResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("bench: allreduce: rank 0 printed %q: %w", sc.Text(), err)
		}
		report(r)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("bench: allreduce: reading rank 0: %w", err)
	}
	var failed error
	for _, p := range procs {
		p.In.Close()
		if err := p.Cmd.Wait(); err != nil && failed == nil {
			failed = fmt.Errorf("bench: allreduce: rank %d (pid %d): %w", p.Rank, p.Pid(), err)
		}
	}
	return failed
}

// benchJob is the job the benchmark's ranks join, and its certificates name.
const benchJob = "bench"

// AllReduceRank is rank `rank` of an AllReduce over a process transport
// (TransportTCP, TransportShm or TransportAuto), in the
// process RankArgs(rank, tls) started (over mutual TLS when cfg.TLSFiles
// are set): it announces its data-plane address on
// stdout, reads the peers' from stdin, measures, and (rank 0) writes each
// size's figures to stdout as a JSON line for the launcher to relay. It sets
// GOMAXPROCS to cfg.Threads' share, so it belongs in a process of its own.
func AllReduceRank(ctx context.Context, cfg AllReduceConfig, rank int, stdin io.Reader, stdout io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if rank < 0 || rank >= cfg.Ranks {
		return fmt.Errorf("bench: allreduce: rank %d of %d", rank, cfg.Ranks)
	}
	runtime.GOMAXPROCS(launch.ThreadsPerRank(cfg.Threads, cfg.Ranks))
	bind := cfg.Bind
	if bind == "" {
		bind = "127.0.0.1:0"
	}
	opts := collective.TCPOptions{Bind: bind, Logger: cfg.Logger}
	var suite string
	if cfg.TLSFiles.Enabled() {
		m, err := pki.Load(cfg.TLSFiles, benchJob, nil)
		if err != nil {
			return fmt.Errorf("bench: allreduce: rank %d: %w", rank, err)
		}
		opts.TLS = &collective.TLSConfigs{Server: m.Server(benchJob), Client: m.Client(benchJob)}
	}
	tr, err := collective.ListenTCP(opts)
	if err != nil {
		return err
	}
	defer tr.Close()
	if opts.TLS != nil {
		if suite, err = cipherSuite(ctx, tr.Addr(), opts.TLS); err != nil {
			return fmt.Errorf("bench: allreduce: rank %d: %w", rank, err)
		}
	}
	peers, err := launch.Announce(stdout, bufio.NewReader(stdin), tr.Addr())
	if err != nil {
		return err
	}
	if len(peers) != cfg.Ranks {
		return fmt.Errorf("bench: allreduce: the launcher sent %d peers for %d ranks", len(peers), cfg.Ranks)
	}
	kind, err := collective.ParseTransportKind(cfg.Transport)
	if err != nil {
		return err
	}
	transport, err := collective.NewTransport(kind, tr, collective.ShmOptions{Logger: cfg.Logger})
	if err != nil {
		return err
	}
	m := collective.Membership{Job: benchJob, Generation: 1, Rank: rank, Peers: peers}
	if kind == collective.TransportAuto {
		// Every rank runs on this host, so each one's identity is ours.
		host, err := collective.HostIdentity()
		if err != nil {
			return err
		}
		m.Hosts = make([]string, len(peers))
		for i := range m.Hosts {
			m.Hosts[i] = host
		}
	}
	g, err := collective.Join(ctx, transport, m, cfg.groupOptions())
	if err != nil {
		return fmt.Errorf("bench: allreduce: rank %d joining: %w", rank, err)
	}
	defer g.Close()
	enc := json.NewEncoder(stdout)
	return measureRank(ctx, g, cfg, func(r AllReduceResult) {
		r.TLS = suite
		enc.Encode(r)
	})
}

// cipherSuite is the suite TLS 1.3 settles on with the transport at
// addr: this rank's own, probed over mutual TLS as a peer would dial it
// (crypto/tls puts AES-GCM first when the CPU has AES-NI, ChaCha20
// otherwise). A transport without TLS fails the probe.
func cipherSuite(ctx context.Context, addr string, cfg *collective.TLSConfigs) (string, error) {
	var suite uint16
	cc := cfg.Client.Clone()
	cc.VerifyConnection = func(cs tls.ConnectionState) error {
		suite = cs.CipherSuite
		return nil
	}
	if err := collective.Probe(ctx, addr, cc); err != nil {
		return "", fmt.Errorf("probing its own data plane over TLS: %w", err)
	}
	return tls.CipherSuiteName(suite), nil
}
