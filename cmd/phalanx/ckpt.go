package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
	"io"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/phalanx-rt/phalanx/checkpoint"
)

const ckptUsage = `Usage:
  phalanx ckpt ls --checkpoint URL              the checkpoints, newest first, and whether each is complete
  phalanx ckpt inspect --checkpoint URL NAME    one checkpoint's manifest
  phalanx ckpt verify --checkpoint URL [NAME]   read and check every checksum (default: every complete checkpoint)
  phalanx ckpt rm --checkpoint URL NAME...      delete checkpoints (or --keep N: what retention would not keep)

Run "phalanx ckpt SUBCOMMAND --help" for the flags of each.
`

// runCkpt is "phalanx ckpt ls|inspect|verify|rm".
func runCkpt(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usagef("ckpt: name what to do: ls, inspect, verify or rm")
	}
	sub := args[0]
	var help string
	switch sub {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, ckptUsage)
		return nil
	case "ls":
		help = "Lists the checkpoints at --checkpoint, newest first: name, step, time, size, world, and whether it is\n" +
			"complete (has a manifest). Incomplete ones are leftovers of uploads that failed or are in flight."
	case "inspect":
		help = "Prints the manifest of one checkpoint (phalanx ckpt inspect --checkpoint URL NAME) as JSON."
	case "verify":
		help = "Reads every object of the named checkpoints (default: every complete one) and checks every\n" +
			"checksum: of each object, block and tensor. Exits 1 naming the first corrupt part of each that fails."
	case "rm":
		help = "Deletes the named checkpoints (manifest first, so each stops existing at once), or with --keep\n" +
			"and/or --keep-every what the retention policy would not keep (and incomplete leftovers older than\n" +
			"the newest complete checkpoint). --dry-run shows what would go."
	default:
		return usagef("ckpt: unknown subcommand %q (want ls, inspect, verify or rm)", sub)
	}
	fs := newFlagSet("ckpt "+sub, help, stderr)
	var url string
	var s3 s3Flags
	var keep, keepEvery int
	var dryRun bool
	fs.StringVar(&url, "checkpoint", "", "the checkpoint store: a directory or s3://bucket/prefix?endpoint=host:port")
	s3.register(fs)
	if sub == "rm" {
		fs.IntVar(&keep, "keep", 0, "delete all but the newest this many complete checkpoints")
		fs.IntVar(&keepEvery, "keep-every", 0, "with --keep: also keep every checkpoint whose sequence number is a multiple of this")
		fs.BoolVar(&dryRun, "dry-run", false, "show what would be deleted, delete nothing")
	}
	// Names and flags may come in any order.
	var names []string
	for rest := args[1:]; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usageError{err.Error()}
		}
		if fs.NArg() == 0 {
			break
		}
		names = append(names, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	switch {
	case url == "":
		return usagef("ckpt %s: --checkpoint is required", sub)
	case sub == "inspect" && len(names) != 1:
		return usagef("ckpt inspect: name one checkpoint")
	case sub == "ls" && len(names) > 0:
		return usagef("ckpt ls: unexpected argument %q", names[0])
	case sub == "rm" && len(names) == 0 && keep == 0:
		return usagef("ckpt rm: name checkpoints, or give --keep")
	case sub == "rm" && len(names) > 0 && keep != 0:
		return usagef("ckpt rm: name checkpoints or give --keep, not both")
	case keep < 0 || keepEvery < 0 || (keepEvery > 0 && keep == 0):
		return usagef("ckpt rm: --keep must be positive, and --keep-every needs it")
	}
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	store, err := checkpoint.OpenExisting(octx, url, s3.credentials())
	cancel()
	if errors.Is(err, checkpoint.ErrNoLocation) && sub == "ls" {
		fmt.Fprintf(stdout, "nothing at %s: %v\n", url, err)
		return nil
	}
	if err != nil {
		return err
	}
	switch sub {
	case "ls":
		return ckptList(ctx, store, stdout)
	case "inspect":
		m, err := checkpoint.ReadManifest(ctx, store, names[0])
		if err != nil {
			return err
		}
		b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(m)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		return nil
	case "verify":
		return ckptVerify(ctx, store, names, stdout)
	}
	return ckptRemove(ctx, store, names, checkpoint.Retention{KeepLast: keep, KeepEvery: keepEvery}, dryRun, stdout)
}

func ckptList(ctx context.Context, store checkpoint.Store, stdout io.Writer) error {
	infos, err := checkpoint.List(ctx, store)
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		fmt.Fprintf(stdout, "no checkpoints at %s\n", store.Location())
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTEP\tTIME\tSIZE\tWORLD\tSTATUS")
	for _, in := range infos {
		world, status := "-", "incomplete (no manifest)"
		if in.Complete {
			status = "complete"
			if m, err := checkpoint.ReadManifest(ctx, store, in.ID); err != nil {
				status = "unreadable manifest: " + err.Error()
			} else {
				world = fmt.Sprint(m.World)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", in.ID, in.Step, in.Modified.UTC().Format(time.RFC3339), bytesize.Format(in.Bytes), world, status)
	}
	return tw.Flush()
}

func ckptVerify(ctx context.Context, store checkpoint.Store, names []string, stdout io.Writer) error {
	if len(names) == 0 {
		infos, err := checkpoint.List(ctx, store)
		if err != nil {
			return err
		}
		for _, in := range infos {
			if in.Complete {
				names = append(names, in.ID)
			}
		}
		if len(names) == 0 {
			return fmt.Errorf("no complete checkpoint at %s", store.Location())
		}
	}
	var bad []error
	for _, id := range names {
		m, err := checkpoint.ReadManifest(ctx, store, id)
		if err == nil {
			err = checkpoint.Verify(ctx, store, m)
		}
		if err != nil {
			fmt.Fprintf(stdout, "%s: CORRUPT: %v\n", id, err)
			bad = append(bad, err)
			continue
		}
		fmt.Fprintf(stdout, "%s: ok (%d objects, %d blocks, %d tensors, %s)\n", id, len(m.Objects), len(m.BlockCrc32C), len(m.Tensors), bytesize.Format(int64(m.TotalBytes)))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d of %d checkpoints failed verification: %w", len(bad), len(names), errors.Join(bad...))
	}
	return nil
}

func ckptRemove(ctx context.Context, store checkpoint.Store, names []string, r checkpoint.Retention, dryRun bool, stdout io.Writer) error {
	if len(names) == 0 {
		plan, err := r.Plan(ctx, store)
		if err != nil {
			return err
		}
		for _, in := range plan {
			names = append(names, in.ID)
		}
	}
	for _, id := range names {
		if dryRun {
			fmt.Fprintf(stdout, "would delete %s\n", id)
			continue
		}
		if err := checkpoint.Remove(ctx, store, id); err != nil {
			return fmt.Errorf("deleting %s: %w", id, err)
		}
		fmt.Fprintf(stdout, "deleted %s\n", id)
	}
	return nil
}
