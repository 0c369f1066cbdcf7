package main

import (
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/chaos"
)

// completionCmd is "phalanx completion bash|zsh|fish|powershell": the
// shell's completion script on stdout. The scripts ask the binary itself
// (its hidden __complete command) what completes a line, so they never go
// stale: commands, flags, and the values of flags that take one of a set.
func completionCmd(stdout io.Writer) *cobra.Command {
	shells := []string{"bash", "zsh", "fish", "powershell"}
	c := &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "shell completion of commands, flags and their values: source <(phalanx completion bash)",
		Long: "Prints the completion script of a shell on stdout. Load it in the current shell with\n" +
			"source <(phalanx completion bash) (or zsh), or keep it where the shell looks for completions.",
		DisableFlagsInUseLine: true,
		ValidArgs:             shells,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("completion: name the shell: bash, zsh, fish or powershell (source <(phalanx completion bash))")
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(stdout, true)
			case "zsh":
				return root.GenZshCompletion(stdout)
			case "fish":
				return root.GenFishCompletion(stdout, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(stdout)
			}
			return usagef("completion: unknown shell %q (want bash, zsh, fish or powershell)", args[0])
		},
	}
	return c
}

// completeTraining completes the values of train's and worker's flags that
// take one of a set.
func completeTraining(c *cobra.Command, reg *phalanx.Registry) {
	completeValues(c, "example", reg.Names()...)
	completeValues(c, "optimizer", "sgd", "momentum", "adam", "adamw")
	completeValues(c, "schedule", "constant", "step", "cosine")
	completeValues(c, "transport", "auto", "tcp", "shm")
	completeValues(c, "wire-dtype", "float32", "fp16", "bf16")
	completeValues(c, "rescale", "batch", "lr")
	completeValues(c, "sync", "bsp", "hybrid", "asp", "ssp")
	completeValues(c, "stale", "drop", "decay")
	completeValues(c, "ps-partition", "range", "hash")
	completeValues(c, "ps-optimizer", "sgd", "adagrad", "adam")
}

// completeLogLevel completes --log-level.
func completeLogLevel(c *cobra.Command) {
	completeValues(c, "log-level", "debug", "info", "warn", "error")
}

// completeValues completes flag's value from values (no file names).
func completeValues(c *cobra.Command, flag string, values ...string) {
	if err := c.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)); err != nil {
		panic(err) // no such flag, or completed twice: a mistake in this file
	}
}

// completeScenarios completes chaos run's arguments: the built-in
// scenarios and ci, or else scenario files.
func completeScenarios(_ *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	var names []cobra.Completion
	for _, s := range append([]chaos.Scenario{{Name: "ci"}}, chaos.Builtin()...) {
		if strings.HasPrefix(s.Name, prefix) {
			names = append(names, s.Name)
		}
	}
	if len(names) == 0 {
		return []cobra.Completion{"yaml", "yml", "json"}, cobra.ShellCompDirectiveFilterFileExt
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
