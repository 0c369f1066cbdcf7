package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/coordinator"
)

func runCoordinator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("coordinator",
		"Runs a coordinator of a job: it campaigns in an etcd election and, while it leads, decides the\n"+
			"job's generations (who trains, in which ring order). Run several for standbys: when the leader\n"+
			"dies, another takes over within --lease-ttl, and a deposed one cannot write (fenced writes).\n"+
			"Without --etcd-endpoints it starts an embedded etcd server under --job-dir and prints its endpoints.", stderr)
	var m membershipFlags
	m.register(fs)
	id := fs.String("id", "", "this coordinator's name in the election (default: host-pid)")
	minW := fs.Int("min-workers", 1, "fewest workers the job trains with")
	maxW := fs.Int("max-workers", 64, "most workers admitted to a ring")
	minTimeout := fs.Duration("min-workers-timeout", time.Minute, "stop the job when it stays below --min-workers this long")
	window := fs.Duration("join-window", time.Second, "how long a newcomer waits so that newcomers arriving together enter one generation")
	jobDir := fs.String("job-dir", "", "with the embedded etcd: its data directory's parent (required then)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := m.check(); err != nil {
		return err
	}
	switch {
	case m.job == "":
		return usagef("--job is required")
	case *minW < 1 || *maxW < *minW:
		return usagef("--min-workers %d, --max-workers %d: want 1 <= min <= max", *minW, *maxW)
	case m.endpoints == "" && *jobDir == "":
		return usagef("give --etcd-endpoints, or --job-dir for an embedded etcd")
	}
	log, err := newLogger(*logLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	endpoints := m.endpointList()
	if len(endpoints) == 0 {
		e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: filepath.Join(*jobDir, "etcd"), Logger: log})
		if err != nil {
			return err
		}
		defer e.Close()
		endpoints = e.Endpoints()
	}
	fmt.Fprintf(stdout, "etcd endpoints: %s\n", strings.Join(endpoints, ","))
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: log.Named("etcd-client")})
	if err != nil {
		return fmt.Errorf("etcd %v: %w", endpoints, err)
	}
	defer cli.Close()
	keys, err := coordinator.KeysFor(m.job)
	if err != nil {
		return usagef("--job: %v", err)
	}
	if *id == "" {
		host, _ := os.Hostname()
		*id = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	c, err := coordinator.New(cli, keys, coordinator.Config{ID: *id, Rendezvous: coordinator.Rendezvous{MinWorkers: *minW, MaxWorkers: *maxW},
		JoinWindow: *window, MinWorkersTimeout: *minTimeout, SessionTTL: m.leaseTTL, Logger: log})
	if err != nil {
		return err
	}
	err = c.Run(ctx)
	if err == nil {
		fmt.Fprintln(stdout, "the job is done")
	}
	return err
}
