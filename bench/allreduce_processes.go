package bench

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
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
// (TransportTCP, TransportShm or TransportAuto), in the process
// RankArgs(rank, tls) started: it announces its data-plane address on
// stdout, reads the peers' from stdin, measures, and (rank 0) writes each
// size's figures to stdout as a JSON line for the launcher to relay. It sets
// GOMAXPROCS to cfg.Threads' share, so it belongs in a process of its own.
// With TLSOn its data plane is mutual TLS of cfg.TLSFiles; with
// TLSCompare it has two, plaintext and TLS (it announces both addresses),
// whose timed iterations alternate.
func AllReduceRank(ctx context.Context, cfg AllReduceConfig, rank int, stdin io.Reader, stdout io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if rank < 0 || rank >= cfg.Ranks {
		return fmt.Errorf("bench: allreduce: rank %d of %d", rank, cfg.Ranks)
	}
	if cfg.tls() != cfg.TLSFiles.Enabled() {
		return fmt.Errorf("bench: allreduce: rank %d: TLS %q, and TLS files %v", rank, cfg.TLS, cfg.TLSFiles.Enabled())
	}
	runtime.GOMAXPROCS(launch.ThreadsPerRank(cfg.Threads, cfg.Ranks))
	planes := []bool{cfg.tls()} // TLS or not, for each data plane
	if cfg.TLS == TLSCompare {
		planes = []bool{false, true}
	}
	trs := make([]*collective.TCPTransport, len(planes))
	suites := make([]string, len(planes))
	addrs := make([]string, len(planes))
	for i, withTLS := range planes {
		var err error
		if trs[i], suites[i], err = listenRank(ctx, cfg, withTLS); err != nil {
			return fmt.Errorf("bench: allreduce: rank %d: %w", rank, err)
		}
		defer trs[i].Close()
		addrs[i] = trs[i].Addr()
	}
	peerLists, err := launch.Announce(stdout, bufio.NewReader(stdin), strings.Join(addrs, " "))
	if err != nil {
		return err
	}
	if len(peerLists) != cfg.Ranks {
		return fmt.Errorf("bench: allreduce: the launcher sent %d peers for %d ranks", len(peerLists), cfg.Ranks)
	}
	kind, err := collective.ParseTransportKind(cfg.Transport)
	if err != nil {
		return err
	}
	groups := make([]*collective.Group, len(planes))
	for i, tr := range trs {
		peers := make([]string, cfg.Ranks)
		for r, l := range peerLists {
			a := strings.Fields(l)
			if len(a) != len(planes) {
				return fmt.Errorf("bench: allreduce: rank %d announced %q, want %d addresses", r, l, len(planes))
			}
			peers[r] = a[i]
		}
		if groups[i], err = joinRank(ctx, cfg, kind, tr, rank, peers); err != nil {
			return err
		}
		defer groups[i].Close()
	}
	enc := json.NewEncoder(stdout)
	return measureRank(ctx, groups, cfg, func(i int, r AllReduceResult) {
		r.TLS = suites[i]
		enc.Encode(r)
	})
}

// listenRank is a rank's data-plane listener, over mutual TLS of
// cfg.TLSFiles when withTLS, and then the cipher suite it speaks.
func listenRank(ctx context.Context, cfg AllReduceConfig, withTLS bool) (*collective.TCPTransport, string, error) {
	opts := collective.TCPOptions{Bind: cmp.Or(cfg.Bind, "127.0.0.1:0"), Logger: cfg.Logger}
	if withTLS {
		m, err := pki.Load(cfg.TLSFiles, benchJob, nil)
		if err != nil {
			return nil, "", err
		}
		opts.TLS = &collective.TLSConfigs{Server: m.Server(benchJob), Client: m.Client(benchJob)}
	}
	tr, err := collective.ListenTCP(opts)
	if err != nil {
		return nil, "", err
	}
	if !withTLS {
		return tr, "", nil
	}
	suite, err := cipherSuite(ctx, tr.Addr(), opts.TLS)
	if err != nil {
		tr.Close()
		return nil, "", err
	}
	return tr, suite, nil
}

// joinRank joins rank's group over tr (as a transport of kind).
func joinRank(ctx context.Context, cfg AllReduceConfig, kind collective.TransportKind, tr *collective.TCPTransport, rank int, peers []string) (*collective.Group, error) {
	transport, err := collective.NewTransport(kind, tr, collective.ShmOptions{Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	m := collective.Membership{Job: benchJob, Generation: 1, Rank: rank, Peers: peers}
	if kind == collective.TransportAuto {
		// Every rank runs on this host, so each one's identity is ours.
		host, err := collective.HostIdentity()
		if err != nil {
			return nil, err
		}
		m.Hosts = make([]string, len(peers))
		for i := range m.Hosts {
			m.Hosts[i] = host
		}
	}
	g, err := collective.Join(ctx, transport, m, cfg.groupOptions())
	if err != nil {
		return nil, fmt.Errorf("bench: allreduce: rank %d joining: %w", rank, err)
	}
	return g, nil
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
