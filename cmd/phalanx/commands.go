package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/phalanx-rt/phalanx"
)

// newRoot builds the command tree: every command's flags, help and
// completion come from it. Commands write to stdout and stderr; help goes
// to stdout.
func newRoot(reg *phalanx.Registry, stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:     "phalanx",
		Short:   "a runtime for fault-tolerant, elastic distributed training",
		Long:    "phalanx: a runtime for fault-tolerant, elastic distributed training.",
		Version: versionLine(),
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRun("command", stderr),
	}
	configureRoot(root, stdout, stderr)
	// The help lists the commands by topic, as kubectl's does.
	add := func(g *cobra.Group, cmds ...*cobra.Command) {
		root.AddGroup(g)
		for _, c := range cmds {
			c.GroupID = g.ID
			root.AddCommand(c)
		}
	}
	add(&cobra.Group{ID: "job", Title: "Jobs"},
		trainCmd(reg, stdout, stderr), workerCmd(reg, stdout, stderr), stopCmd(stdout), statusCmd(stdout))
	add(&cobra.Group{ID: "service", Title: "A job's services, started by hand"},
		coordinatorCmd(stdout, stderr), psCmd(stdout, stderr), etcdCmd(stdout, stderr))
	add(&cobra.Group{ID: "tool", Title: "Tools"},
		ckptCmd(stdout, stderr), sampleCmd(reg, stdout), chaosCmd(reg, stdout, stderr), benchCmd(stdout, stderr), debugCmd(stdout, stderr),
		certsCmd(stdout, stderr))
	add(&cobra.Group{ID: "other", Title: "This command"},
		&cobra.Command{Use: "version", Short: "print the version and the commit it was built from (or --version)", Args: noArgs,
			RunE: func(*cobra.Command, []string) error { fmt.Fprintln(stdout, versionLine()); return nil }},
		completionCmd(stdout))
	root.SetHelpCommandGroupID("other")
	return root
}

// configureRoot gives root the behaviour every phalanx command shares:
// errors are returned, never printed (runMain prints one line) and a usage
// mistake never prints the help; parse errors become one-line usage errors;
// the environment fills the flags the command line did not set; help goes
// to stdout.
func configureRoot(root *cobra.Command, stdout, stderr io.Writer) {
	root.SilenceErrors, root.SilenceUsage = true, true
	root.SuggestionsMinimumDistance = 2
	root.PersistentPreRunE = func(c *cobra.Command, _ []string) error { return flagsFromEnv(c) }
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetHelpFunc(printHelp)
	root.SetFlagErrorFunc(flagMistake)
	root.SetHelpCommand(helpCommand())
}

// leaf is a command that runs: its usage line, one-line summary, and the
// longer text its help starts with.
func leaf(use, short, long string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: long, Args: noArgs}
}

// withRun sets c's run: the flags are parsed (and filled from the
// environment) by then; args are the positional arguments.
func withRun(c *cobra.Command, run func(ctx context.Context, args []string) error) *cobra.Command {
	c.RunE = func(c *cobra.Command, args []string) error { return run(c.Context(), args) }
	return c
}

// group is a command of subcommands (bench, ckpt, chaos): alone or with an
// unknown subcommand it is a usage error, "help" is its help.
func group(use, short, long, what string, stderr io.Writer, subs ...*cobra.Command) *cobra.Command {
	g := &cobra.Command{Use: use, Short: short, Long: long, Args: cobra.ArbitraryArgs, RunE: groupRun(what, stderr),
		SuggestionsMinimumDistance: 2}
	g.AddCommand(subs...)
	return g
}

// groupRun answers a group command run without a known subcommand.
func groupRun(what string, stderr io.Writer) func(*cobra.Command, []string) error {
	return func(c *cobra.Command, args []string) error {
		var names []string
		for _, s := range c.Commands() {
			if s.IsAvailableCommand() {
				names = append(names, s.Name())
			}
		}
		want := names[len(names)-1]
		if len(names) > 1 {
			want = strings.Join(names[:len(names)-1], ", ") + " or " + want
		}
		prefix := ""
		if c.HasParent() {
			prefix = name(c) + ": "
		}
		if len(args) == 0 {
			if !c.HasParent() {
				printHelpTo(stderr, c)
				return usagef("no command given")
			}
			return usagef("%sname the %s: %s", prefix, what, want)
		}
		if args[0] == "help" {
			printHelp(c, nil)
			return nil
		}
		msg := fmt.Sprintf("%sunknown %s %q (want %s)", prefix, what, args[0], want)
		if near := c.SuggestionsFor(args[0]); len(near) > 0 {
			msg += "; did you mean " + strings.Join(near, " or ") + "?"
		}
		return usageError{msg}
	}
}

// noArgs refuses positional arguments as a usage error.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s: unexpected argument %q", name(c), args[0])
	}
	return nil
}

// name is a command's path without "phalanx ": "chaos run".
func name(c *cobra.Command) string {
	return strings.TrimPrefix(c.CommandPath(), "phalanx ")
}

// helpCommand is "phalanx help [COMMAND...]": the command's help, or a
// usage error for one that does not exist.
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "the flags of a command (as phalanx COMMAND --help)",
		ValidArgsFunction: func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			cmd, _, err := c.Root().Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []cobra.Completion
			for _, s := range cmd.Commands() {
				if s.IsAvailableCommand() {
					out = append(out, s.Name())
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				at := cmd
				if at == nil {
					at = c.Root()
				}
				msg := fmt.Sprintf("help: unknown command %q", strings.Join(args, " "))
				if len(rest) > 0 {
					if near := at.SuggestionsFor(rest[0]); len(near) > 0 {
						msg += "; did you mean " + strings.Join(near, " or ") + "?"
					}
				}
				return usageError{msg}
			}
			cmd.InitDefaultHelpFlag()
			printHelp(cmd, nil)
			return nil
		},
	}
}

// flagsFromEnv sets every flag of c the command line did not from its
// environment variable (envOf), if set.
func flagsFromEnv(c *cobra.Command) error {
	var err error
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil || f.Name == "help" || f.Name == "version" {
			return
		}
		env := envOf(f.Name)
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		if serr := c.Flags().Set(f.Name, v); serr != nil {
			err = usagef("%s=%q (--%s): %s", env, v, f.Name, valueMistake(f, serr))
		}
	})
	return err
}

// envOf is the environment variable of flag name: PHALANX_LOG_LEVEL for
// log-level.
func envOf(name string) string {
	return "PHALANX_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flagMistake turns pflag's parse errors into one-line usage errors naming
// the flag as it is typed (--name), suggesting the known flags nearest to
// an unknown one.
func flagMistake(c *cobra.Command, err error) error {
	cmd := name(c)
	var notExist *pflag.NotExistError
	var needs *pflag.ValueRequiredError
	var invalid *pflag.InvalidValueError
	switch {
	case errors.As(err, &notExist) && notExist.GetSpecifiedShortnames() != "":
		// -workers: one dash, read as the shorthands w, o, r, ...
		typed := notExist.GetSpecifiedShortnames()
		if f := c.Flags().Lookup(typed); f != nil {
			return usagef("%s: -%s: long flags take two dashes: --%s", cmd, typed, typed)
		}
		return usagef("%s: unknown flag -%s", cmd, typed)
	case errors.As(err, &notExist):
		typed := notExist.GetSpecifiedName()
		line := fmt.Sprintf("%s: unknown flag --%s", cmd, typed)
		if near := nearestFlags(c.Flags(), typed); len(near) > 0 {
			line += "; did you mean --" + strings.Join(near, " or --") + "?"
		}
		return usageError{line}
	case errors.As(err, &needs):
		return usagef("%s: --%s needs a value", cmd, needs.GetFlag().Name)
	case errors.As(err, &invalid):
		return usagef("--%s %q: %s", invalid.GetFlag().Name, invalid.GetValue(), valueMistake(invalid.GetFlag(), invalid.Unwrap()))
	}
	return usagef("%s: %v", cmd, err)
}

// valueMistake says what a flag of f's type wants, for a value it refused.
func valueMistake(f *pflag.Flag, err error) string {
	switch f.Value.Type() {
	case "int", "int64":
		return "want a whole number"
	case "uint64":
		return "want a whole number from 0"
	case "float64":
		return "want a number"
	case "duration":
		return "want a duration such as 500ms, 30s or 5m"
	case "bool":
		return "want true or false"
	}
	return err.Error()
}

// nearestFlags are the flags of fs within a few edits of name (or that it
// begins), nearest first, at most three.
func nearestFlags(fs *pflag.FlagSet, name string) []string {
	type cand struct {
		name string
		d    int
	}
	var cs []cand
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		if d <= max(2, len(name)/3) {
			cs = append(cs, cand{f.Name, d})
		}
	})
	slices.SortStableFunc(cs, func(a, b cand) int { return a.d - b.d })
	var out []string
	for i := 0; i < len(cs) && i < 3; i++ {
		out = append(out, cs[i].name)
	}
	return out
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
