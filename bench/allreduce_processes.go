package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/launch"
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
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	procs, err := launch.Start(startCtx, cfg.Ranks, func(rank int) *exec.Cmd {
		cmd := exec.CommandContext(ctx, exe, cfg.RankArgs(rank)...)
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

// AllReduceRank is rank `rank` of an AllReduce over a process transport
// (TransportTCP, TransportShm or TransportAuto), in the
// process RankArgs(rank) started: it announces its data-plane address on
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
	tr, err := collective.ListenTCP(collective.TCPOptions{Bind: bind, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	defer tr.Close()
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
	m := collective.Membership{Job: "bench", Generation: 1, Rank: rank, Peers: peers}
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
	return measureRank(ctx, g, cfg, func(r AllReduceResult) { enc.Encode(r) })
}
