package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/coordinator"
)

// coordinatorCmd is phalanx coordinator: a standby-capable coordinator.
func coordinatorCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := leaf("coordinator", "a job's coordinator (elected; run several for standbys)",
		"Runs a coordinator of a job: it campaigns in an etcd election and, while it leads, decides the\n"+
			"job's generations (who trains, in which ring order). Run several for standbys: when the leader\n"+
			"dies, another takes over within --lease-ttl, and a deposed one cannot write (fenced writes).\n"+
			"Without --etcd-endpoints it starts an embedded etcd server under --job-dir and prints its endpoints.")
	fs := cmd.Flags()
	var f configFlags
	f.cfg = phalanx.DefaultConfig()
	f.registerMembership(fs)
	c := phalanx.CoordinatorConfig{MinWorkers: 1, MaxWorkers: 64, MinWorkersTimeout: time.Minute, JoinWindow: time.Second}
	fs.StringVar(&c.ID, "id", "", "this coordinator's name in the election (default: host-pid)")
	fs.IntVar(&c.MinWorkers, "min-workers", c.MinWorkers, "fewest workers the job trains with")
	fs.IntVar(&c.MaxWorkers, "max-workers", c.MaxWorkers, "most workers admitted to a ring")
	fs.IntVar(&c.Workers, "workers", 0, "how many workers you start: the first ring waits for them all (up to --min-workers-timeout); 0: it forms with the first to register")
	fs.DurationVar(&c.MinWorkersTimeout, "min-workers-timeout", c.MinWorkersTimeout, "stop the job when it stays below --min-workers this long")
	fs.DurationVar(&c.JoinWindow, "join-window", c.JoinWindow, "how long a newcomer waits so that newcomers arriving together enter one generation")
	fs.StringVar(&c.JobDir, "job-dir", "", "with the embedded etcd: its data directory's parent (required then)")
	return withLoggedRun(cmd, stderr, func(ctx context.Context, _ []string, log *zap.Logger) error {
		c.Job, c.Etcd, c.LeaseTTL, c.EtcdDialTimeout, c.TLS, c.Logger = f.cfg.Job, endpointList(f.etcd), f.cfg.LeaseTTL, f.cfg.EtcdDialTimeout, f.cfg.TLS, log
		c.OnEndpoints = func(e []string) { fmt.Fprintf(stdout, "etcd endpoints: %s\n", strings.Join(e, ",")) }
		if err := phalanx.RunCoordinator(ctx, c); err != nil {
			return asUsage(err)
		}
		fmt.Fprintln(stdout, "the job is done")
		return nil
	})
}

// psCmd is phalanx ps: one parameter server of a job.
func psCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := leaf("ps", "one parameter server of a job (train starts them for parameter-server models)",
		"Runs one parameter server of a job: it reads the job's configuration from etcd, hosts every shard,\n"+
			"registers with a lease and serves the role the coordinator's shard map gives it (primary of some\n"+
			"shards, backup of others). phalanx train starts these itself for parameter-server models.")
	fs := cmd.Flags()
	var f configFlags
	f.cfg = phalanx.DefaultConfig()
	f.registerMembership(fs)
	id := fs.String("id", "", "this server's id (default: host-pid)")
	fs.StringVar(&f.cfg.Bind, "listen", f.cfg.Bind, "the data plane's address (0.0.0.0:PORT or [::]:PORT: every interface, with --advertise)")
	fs.StringVar(&f.cfg.Advertise, "advertise", "", "the address the workers reach this server at (HOST, or HOST:PORT behind a proxy); needed when\n--listen is every interface")
	return withLoggedRun(cmd, stderr, func(ctx context.Context, _ []string, log *zap.Logger) error {
		f.cfg.Etcd, f.cfg.Logger = endpointList(f.etcd), log
		return asUsage(phalanx.RunPSServer(ctx, f.cfg, *id, func(addr string) { fmt.Fprintf(stdout, "ps %s serving on %s\n", *id, addr) }))
	})
}

// stopCmd is phalanx stop: ask a job to stop after a final checkpoint.
func stopCmd(stdout io.Writer) *cobra.Command {
	cmd := leaf("stop", "ask a running job to stop after a final checkpoint",
		"Asks every worker of a running job to stop at the next step boundary after a final checkpoint\n"+
			"(a job without --checkpoint ignores it). Starting the job again resumes it.")
	fs := cmd.Flags()
	var f configFlags
	f.cfg = phalanx.DefaultConfig()
	f.registerMembership(fs)
	reason := fs.String("reason", "phalanx stop", "why, for the job's log")
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		if f.etcd == "" || f.cfg.Job == "" {
			return usagef("stop: --etcd-endpoints and --job are required")
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := phalanx.Stop(sctx, phalanx.Access{Etcd: endpointList(f.etcd), Job: f.cfg.Job, TLS: f.cfg.TLS}, *reason); err != nil {
			return asUsage(err)
		}
		fmt.Fprintf(stdout, "job %s asked to stop\n", f.cfg.Job)
		return nil
	})
}

// statusCmd is phalanx status: a running job's status, from its etcd.
func statusCmd(stdout io.Writer) *cobra.Command {
	cmd := leaf("status", "a running job's status: a table, JSON, or a live page",
		"Prints a running job's status, read from its etcd: the state, the ring and its generations, every\n"+
			"worker (state, step, samples/s, last heartbeat), excluded stragglers, checkpoints with their\n"+
			"verification, and the last events, as its launcher publishes them every two seconds (for workers\n"+
			"started by hand without a launcher: the ring alone). --json prints it for scripts; --serve serves\n"+
			"the same live page the launcher's --status does, for a job whose launcher runs elsewhere.")
	cmd.Example = examplesOf["status"]
	fs := cmd.Flags()
	var f configFlags
	f.cfg = phalanx.DefaultConfig()
	fs.StringVar(&f.etcd, "etcd-endpoints", "", "comma-separated endpoints of the job's etcd cluster")
	fs.StringVar(&f.cfg.Job, "job", "", "the job's name")
	registerTLS(fs, &f.cfg.TLS)
	asJSON := fs.Bool("json", false, "print the status as one JSON object")
	serve := fs.String("serve", "", "serve the live status page at this address (host:port) until interrupted")
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		if f.etcd == "" || f.cfg.Job == "" {
			return usagef("status: --etcd-endpoints and --job are required")
		}
		access := phalanx.Access{Etcd: endpointList(f.etcd), Job: f.cfg.Job, TLS: f.cfg.TLS}
		if *serve != "" {
			return asUsage(phalanx.ServeStatus(ctx, access, *serve, func(addr string) {
				fmt.Fprintf(stdout, "status of job %s: http://%s/\n", f.cfg.Job, addr)
			}))
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s, err := phalanx.JobStatus(sctx, access)
		if err != nil {
			return asUsage(err)
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(s)
		}
		return phalanx.WriteStatus(stdout, s)
	})
}

// debugCmd groups the tools that read a job's records after the fact.
func debugCmd(stdout, stderr io.Writer) *cobra.Command {
	hangCmd := leaf("hang", "name the rank at fault in a job's failed collective operations",
		"Reads a job's saved event log (--events of phalanx train) and, for each generation whose collective\n"+
			"operations failed (a timeout, an abort), names in one line the rank that never entered the operation\n"+
			"the others hung in, or entered another one, from the survivors' dumps of their last operations.")
	file := hangCmd.Flags().String("events", "", "the job's event log (JSON lines)")
	withRun(hangCmd, func(ctx context.Context, _ []string) error {
		if *file == "" {
			return usagef("debug hang: --events is required")
		}
		fs, err := phalanx.AnalyzeHangs(*file)
		if err != nil {
			return err
		}
		if len(fs) == 0 {
			fmt.Fprintln(stdout, "no collective operation failed in that log (no collective_dump events)")
		}
		for _, f := range fs {
			fmt.Fprintln(stdout, f.Line)
		}
		return nil
	})
	return group("debug", "read a job's records after the fact", "Tools that read what a job left behind.", "debug tool", stderr, hangCmd)
}

// etcdCmd runs one member of an etcd cluster in this process: the embedded
// server, for tests and small deployments without an etcd installation.
func etcdCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := leaf("etcd", "one embedded etcd member (three make a cluster)",
		"Runs one etcd member (the embedded server) until interrupted, and prints its client endpoint once\n"+
			"it serves. With --initial-cluster, three such processes make a 3-member cluster. With --tls-ca,\n"+
			"--tls-cert and --tls-key it serves clients and peers over mutual TLS (https), admitting only\n"+
			"certificates of its CA for the jobs its own certificate names.")
	fs := cmd.Flags()
	name := fs.String("name", "phalanx", "member name")
	dir := fs.String("dir", "", "data directory (required)")
	host := fs.String("host", "127.0.0.1", "listen host")
	clientPort := fs.Int("client-port", 0, "client port (0: any free one)")
	peerPort := fs.Int("peer-port", 0, "peer port (0: any free one; fix it with --initial-cluster)")
	cluster := fs.String("initial-cluster", "", "every member as name=http://host:peer-port (https:// with TLS), comma-separated (default: this member alone)")
	var tlsFiles phalanx.TLSFiles
	registerTLS(fs, &tlsFiles)
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		switch {
		case *dir == "":
			return usagef("--dir is required")
		case *clientPort < 0 || *clientPort > 65535 || *peerPort < 0 || *peerPort > 65535:
			return usagef("--client-port and --peer-port must be ports")
		case *cluster != "" && (*peerPort == 0 || !strings.Contains(*cluster, *name+"=")):
			return usagef("--initial-cluster needs --peer-port and an entry for --name %q", *name)
		}
		log, err := newLogger(*logLevel, stderr)
		if err != nil {
			return err
		}
		defer log.Sync()
		e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: *dir, Name: *name, Host: *host, Logger: log,
			ClientPort: *clientPort, PeerPort: *peerPort, InitialCluster: *cluster, TLS: tlsFiles})
		if err != nil {
			return err
		}
		defer e.Close()
		fmt.Fprintf(stdout, "etcd endpoints: %s\n", strings.Join(e.Endpoints(), ","))
		<-ctx.Done()
		return nil
	})
}

func setThreads(n int) {
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
}

func jsonLines(w io.Writer) func(phalanx.Report) { return phalanx.ReportLines(w) }
