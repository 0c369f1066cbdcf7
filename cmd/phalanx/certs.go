package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/phalanx-rt/phalanx/pki"
)

// certsCmd is "phalanx certs init": a development CA and certificates.
func certsCmd(stdout, stderr io.Writer) *cobra.Command {
	return group("certs", "make a development CA and per-host certificates for a job's mutual TLS",
		"Makes the TLS material of a job: a development CA and a certificate per host, each naming the job\n"+
			"(a URI SAN phalanx://job/NAME), usable as client and server. For production, issue the same from\n"+
			"your own CA: a peer is admitted when its certificate chains to the CA given and names the job.",
		"subcommand", stderr, certsInitCmd(stdout))
}

func certsInitCmd(stdout io.Writer) *cobra.Command {
	cmd := leaf("init DIR --job NAME --hosts HOST,...", "write a new CA and a certificate per host into DIR",
		"Writes into DIR (created if needed) ca.pem and ca-key.pem, a new ECDSA P-256 CA, and for each host\n"+
			"HOST.pem and HOST-key.pem, a certificate naming the job and the host (its IP address or DNS name).\n"+
			"Keys are written 0600. No existing file is overwritten: if any of them exists, nothing is written.\n"+
			"Give each host its certificate and key, and every host the CA certificate (not its key).")
	cmd.Args = cobra.ExactArgs(1)
	fs := cmd.Flags()
	job := fs.String("job", "", "the job every certificate names (required: a certificate of another job is refused)")
	hosts := fs.StringSlice("hosts", nil, "the hosts to issue certificates for, comma-separated (addresses or DNS names)")
	days := fs.Int("days", 365, "how long the CA and the certificates are valid, in days")
	return withRun(cmd, func(_ context.Context, args []string) error {
		switch {
		case *job == "":
			return usagef("certs init: --job is required: every certificate names the job it may join")
		case strings.ContainsAny(*job, "/\x00"):
			return usagef("certs init: --job %q: want a name without '/'", *job)
		case len(*hosts) == 0:
			return usagef("certs init: --hosts is required: one certificate per host")
		case *days < 1:
			return usagef("certs init: --days %d: want at least 1", *days)
		}
		files, err := pki.Init(args[0], pki.InitOptions{Job: *job, Hosts: *hosts, Now: time.Now(), Validity: time.Duration(*days) * 24 * time.Hour})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "CA: %s (its key %s: keep it off the hosts)\n", files[0].CA, strings.TrimSuffix(files[0].CA, ".pem")+"-key.pem")
		for i, f := range files {
			fmt.Fprintf(stdout, "%s: certificate %s, key %s\n", (*hosts)[i], f.Cert, f.Key)
		}
		return nil
	})
}
