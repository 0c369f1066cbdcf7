package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/phalanx-rt/phalanx"
)

// sampleCmd is phalanx sample: text from a checkpoint of a generating
// model (gpt), through phalanx.Sample.
func sampleCmd(reg *phalanx.Registry, stdout io.Writer) *cobra.Command {
	cmd := leaf("sample", "generate text from a checkpoint of a language model (gpt)",
		"Rebuilds the model a checkpoint was written by (its manifest records the model and its options),\n"+
			"loads its parameters, every tensor checked against its checksums, and continues --prompt by\n"+
			"--tokens characters drawn at --temperature (0: always the likeliest) with --seed: the same seed\n"+
			"gives the same text. The newest complete checkpoint at --checkpoint, or --name.")
	cmd.Example = "  phalanx sample --checkpoint checkpoints/gpt --prompt 'func (s *Server) ' --tokens 300"
	fs := cmd.Flags()
	var sc phalanx.SampleConfig
	var prompt string
	var s3 s3Flags
	fs.StringVar(&sc.Checkpoint, "checkpoint", "", "the checkpoint store: a directory or s3://bucket/prefix?endpoint=host:port")
	fs.StringVar(&sc.Name, "name", "", "the checkpoint to read (default: the newest complete one)")
	fs.StringVar(&prompt, "prompt", "package ", "the text to continue")
	fs.IntVar(&sc.Tokens, "tokens", 400, "characters to generate")
	fs.Float64Var(&sc.Temperature, "temperature", 0.8, "sampling temperature: 0 picks the likeliest character; higher is more varied")
	fs.Uint64Var(&sc.Seed, "seed", 1, "the seed of the sampling")
	s3.register(fs)
	return withRun(cmd, func(ctx context.Context, _ []string) error {
		switch {
		case sc.Checkpoint == "":
			return usagef("sample: --checkpoint is required")
		case sc.Tokens < 0:
			return usagef("sample: --tokens %d: want 0 or more", sc.Tokens)
		case sc.Temperature < 0:
			return usagef("sample: --temperature %v: want 0 or more", sc.Temperature)
		}
		sc.Prompt, sc.Credentials = []byte(prompt), s3.credentials()
		out, err := phalanx.Sample(ctx, sc, reg)
		if err != nil {
			return err
		}
		_, err = stdout.Write(append(out, '\n'))
		return err
	})
}
