package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// printHelp is every command's help, on its stdout.
func printHelp(c *cobra.Command, _ []string) { printHelpTo(c.OutOrStdout(), c) }

// printHelpTo writes c's help to w. A command of subcommands lists them
// (and theirs) with a line each; a command that runs gives its usage line,
// what it does, its flags (train's and worker's by topic), how the
// environment sets them, and its examples.
func printHelpTo(w io.Writer, c *cobra.Command) {
	if c.HasAvailableSubCommands() {
		printCommands(w, c)
		return
	}
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", c.UseLine(), c.Long)
	fs := c.Flags()
	if groupedHelp[c.Name()] && !c.Parent().HasParent() {
		printGrouped(w, fs)
	} else {
		fmt.Fprintln(w, "\nFlags:")
		fs.VisitAll(func(f *pflag.Flag) { printFlag(w, f) })
	}
	fmt.Fprintln(w, "\n"+envNote)
	if c.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s", c.Example)
	}
}

// flagTopics group the flags of train and worker in their help, in this
// order; a flag of no topic (a model's option) is listed under "Model".
var flagTopics = []struct {
	name  string
	flags []string
}{
	{"Job", []string{"steps", "batch", "seed", "job", "threads", "events", "log-every", "json"}},
	{"Model (--example and its options)", []string{"example"}},
	{"Optimizer and schedule", []string{"optimizer", "lr", "momentum", "nesterov", "weight-decay", "schedule", "warmup",
		"decay-every", "decay-factor", "clip", "micro-batches", "local-steps", "rescale", "reference-world"}},
	{"Synchronisation", []string{"sync", "step-deadline", "deadline-factor", "quorum", "exclude-after", "readmit-after",
		"stale", "stale-decay", "staleness"}},
	{"Checkpoints", []string{"checkpoint", "checkpoint-every-steps", "checkpoint-every", "checkpoint-keep", "checkpoint-keep-every",
		"checkpoint-wait", "resume", "s3-access-key", "s3-secret-key"}},
	{"Elastic membership and recovery", []string{"workers", "min-workers", "max-workers", "min-workers-timeout", "join-window",
		"etcd-endpoints", "etcd-dial-timeout", "lease-ttl", "unreachable", "coordinator", "commit-every", "max-restarts",
		"restart-window", "bind", "advertise", "rank-hint", "worker-index"}},
	{"Data plane", []string{"transport", "bucket", "timeout", "wire-dtype", "error-feedback"}},
	{"Mutual TLS (every plane)", []string{"tls", "tls-ca", "tls-cert", "tls-key"}},
	{"Parameter server (sparse-lr)", []string{"ps-servers", "ps-shards", "ps-replicas", "ps-partition", "ps-optimizer", "ps-lr",
		"ps-cache-rows", "ps-cache-staleness", "report-every"}},
	{"Pipeline and tensor parallelism (deep-mlp, gpt)", []string{"pp", "dp", "tp", "max-memory", "pp-schedule", "pp-chunks", "pp-cuts", "pp-balance", "pp-recompute"}},
	{"Fault injection", []string{"fail-at", "fail-times", "inject-slow", "inject-pause", "inject-wrong-op"}},
	{"Logs", []string{"job-dir", "log-dir", "log-level"}},
	{"Observability (docs/metrics.md)", []string{"metrics", "status", "trace"}},
}

// printCommands lists the commands under c, and theirs, a line each, by
// the topics of c's groups.
func printCommands(w io.Writer, c *cobra.Command) {
	type line struct{ use, short string }
	lines := map[string][]line{} // by group ID
	var walk func(c *cobra.Command, group string)
	walk = func(c *cobra.Command, group string) {
		for _, s := range c.Commands() {
			g := group
			if g == "" {
				g = s.GroupID
			}
			switch {
			case !s.IsAvailableCommand():
			case s.HasAvailableSubCommands():
				walk(s, g)
			default:
				lines[g] = append(lines[g], line{s.UseLine(), s.Short})
			}
		}
	}
	walk(c, "")
	if !c.HasParent() {
		lines["other"] = append(lines["other"], line{"phalanx help COMMAND", "the flags of a command (as phalanx COMMAND --help)"})
	}
	width := 0
	for _, ls := range lines {
		for _, l := range ls {
			width = max(width, len(l.use))
		}
	}
	fmt.Fprintf(w, "%s\n", c.Long)
	groups := c.Groups()
	if len(groups) == 0 {
		groups = []*cobra.Group{{Title: "Usage"}}
	}
	for _, g := range groups {
		fmt.Fprintf(w, "\n%s:\n", g.Title)
		for _, l := range lines[g.ID] {
			fmt.Fprintf(w, "  %-*s  %s\n", width, l.use, l.short)
		}
	}
	fmt.Fprintf(w, "\nRun \"%s COMMAND --help\" for the flags of each.\n", c.CommandPath())
}

// printGrouped writes fs's flags by topic: those of each topic in its
// order, then the rest (the models' options) under the model's topic.
func printGrouped(w io.Writer, fs *pflag.FlagSet) {
	placed := map[string]bool{}
	for _, t := range flagTopics {
		for _, n := range t.flags {
			placed[n] = true
		}
	}
	var rest []*pflag.Flag
	fs.VisitAll(func(f *pflag.Flag) {
		if !placed[f.Name] && !f.Hidden && f.Name != "help" {
			rest = append(rest, f)
		}
	})
	for _, t := range flagTopics {
		var fl []*pflag.Flag
		for _, n := range t.flags {
			if f := fs.Lookup(n); f != nil {
				fl = append(fl, f)
			}
		}
		if strings.HasPrefix(t.name, "Model") {
			fl = append(fl, rest...)
		}
		if len(fl) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", t.name)
		for _, f := range fl {
			printFlag(w, f)
		}
	}
}

// printFlag writes one flag as "  --name TYPE" and its usage, indented,
// with its default unless zero or already said; not --help, nor a hidden
// flag.
func printFlag(w io.Writer, f *pflag.Flag) {
	if f.Hidden || f.Name == "help" {
		return
	}
	typ, usage := pflag.UnquoteUsage(f)
	if typ == "value" { // a flag.Value of ours: text
		typ = "string"
	}
	line := "  --" + f.Name
	if typ != "" {
		line += " " + typ
	}
	def := strings.Trim(f.DefValue, `"`)
	switch def {
	case "", "0", "false", "0s", "[]":
	default:
		if !strings.Contains(usage, "(default") {
			usage += fmt.Sprintf(" (default %s)", def)
		}
	}
	fmt.Fprintf(w, "%s\n        %s\n", line, strings.ReplaceAll(usage, "\n", "\n        "))
}

// groupedHelp are the commands whose help lists the flags by topic (the
// training flags); examples close a command's help.
var (
	groupedHelp = map[string]bool{"train": true, "worker": true}
	examplesOf  = map[string]string{
		"train": `  phalanx train --workers 4 --steps 300 --checkpoint checkpoints/mlp --checkpoint-every-steps 50
      the main job: 4 elastic workers on this host, checkpoints every 50 steps; run it again to resume
  phalanx train --workers 4 --sync hybrid --step-deadline auto --exclude-after 6/10
      hybrid synchronisation: a step closes at its deadline without the late, persistent stragglers leave
  phalanx train --example sparse-lr --workers 4 --ps-servers 2 --sync ssp
      a parameter-server job
  PHALANX_WORKERS=8 phalanx train --checkpoint 's3://bucket/run1?endpoint=127.0.0.1:9000'
      flags from the environment, checkpoints in S3 (MinIO)
`,
		"status": `  phalanx status --etcd-endpoints 10.0.0.1:2379 --job run1
      the job's status as tables: its ring, generations, workers, stragglers, checkpoints, last events
  phalanx status --etcd-endpoints 10.0.0.1:2379 --job run1 --serve 127.0.0.1:8080
      its live status page, served here, for a job whose launcher runs elsewhere
`,
		"worker": `  phalanx worker --etcd-endpoints 10.0.0.1:2379 --job run1 --steps 300 --checkpoint 's3://ckpt/run1?endpoint=10.0.0.2:9000'
      one worker of job run1 on this host; start one per host with the same training flags
  phalanx worker --etcd-endpoints 10.0.0.1:2379 --job run1 --json
      the same, printing its reports as JSON lines
`,
	}
)

// envNote is how every help ends: flags come from the environment too.
const envNote = "Every flag may come from the environment instead: --workers from PHALANX_WORKERS, --log-level\n" +
	"from PHALANX_LOG_LEVEL, and so on; the command line wins."
