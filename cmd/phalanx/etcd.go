package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/phalanx-rt/phalanx/coordinator"
)

// runEtcd runs one member of an etcd cluster in this process: the embedded
// server, for tests and small deployments without an etcd installation.
func runEtcd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("etcd",
		"Runs one etcd member (the embedded server) until interrupted, and prints its client endpoint once\n"+
			"it serves. With --initial-cluster, three such processes make a 3-member cluster.", stderr)
	name := fs.String("name", "phalanx", "member name")
	dir := fs.String("dir", "", "data directory (required)")
	host := fs.String("host", "127.0.0.1", "listen host")
	clientPort := fs.Int("client-port", 0, "client port (0: any free one)")
	peerPort := fs.Int("peer-port", 0, "peer port (0: any free one; fix it with --initial-cluster)")
	cluster := fs.String("initial-cluster", "", "every member as name=http://host:peer-port, comma-separated (default: this member alone)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
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
		ClientPort: *clientPort, PeerPort: *peerPort, InitialCluster: *cluster})
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Fprintf(stdout, "etcd endpoints: %s\n", strings.Join(e.Endpoints(), ","))
	<-ctx.Done()
	return nil
}
