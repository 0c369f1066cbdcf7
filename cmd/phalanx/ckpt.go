package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// ckptCmd is "phalanx ckpt ls|inspect|verify|rm".
func ckptCmd(stdout, stderr io.Writer) *cobra.Command {
	return group("ckpt", "list, show, verify or delete the checkpoints at --checkpoint URL",
		"Lists, shows, verifies or deletes the checkpoints of a store (a directory or an s3:// location).", "subcommand", stderr,
		ckptSub("ls", "ls --checkpoint URL [--verify]",
			"the checkpoints, newest first, whether each is complete (and verifies)",
			"Lists the checkpoints at --checkpoint, newest first: name, step, time, size, world, whether it is\n"+
				"complete (has a manifest that matches its own checksum), and with --verify whether every byte\n"+
				"of it does (phalanx ckpt verify's check). Incomplete ones are leftovers of uploads that failed or\n"+
				"are in flight.", stdout),
		ckptSub("inspect", "inspect --checkpoint URL NAME",
			"one checkpoint: step, position, tensors, objects (--json: its manifest)",
			"Summarises one checkpoint (phalanx ckpt inspect --checkpoint URL NAME): its step, sampler position,\n"+
				"world, job and hashes, its tensors with shapes and bytes, and its objects with whether each is in\n"+
				"the store at its size. --json prints the manifest itself.", stdout),
		ckptSub("verify", "verify --checkpoint URL [NAME...]",
			"read and check every checksum (default: every complete checkpoint)",
			"Reads every object of the named checkpoints (default: every complete one) and checks every\n"+
				"checksum: of each object, block and tensor. Exits 1 naming the first corrupt part of each that fails.", stdout),
		ckptSub("rm", "rm --checkpoint URL NAME... | --keep N",
			"delete checkpoints (or --keep N: what retention would not keep)",
			"Deletes the named checkpoints (manifest first, so each stops existing at once), or with --keep\n"+
				"and/or --keep-every what the retention policy would not keep (and incomplete leftovers older than\n"+
				"the newest complete checkpoint). --dry-run shows what would go.", stdout),
	)
}

// ckptSub is one of ckpt's subcommands: they share --checkpoint, the S3
// credentials and the store's opening.
func ckptSub(sub, use, short, long string, stdout io.Writer) *cobra.Command {
	cmd := leaf(use, short, long)
	cmd.Args, cmd.DisableFlagsInUseLine = cobra.ArbitraryArgs, true
	fs := cmd.Flags()
	var url string
	var s3 s3Flags
	var keep, keepEvery int
	var dryRun, verify, asJSON bool
	fs.StringVar(&url, "checkpoint", "", "the checkpoint store: a directory or s3://bucket/prefix?endpoint=host:port")
	s3.register(fs)
	switch sub {
	case "rm":
		fs.IntVar(&keep, "keep", 0, "delete all but the newest this many complete checkpoints")
		fs.IntVar(&keepEvery, "keep-every", 0, "with --keep: also keep every checkpoint whose sequence number is a multiple of this")
		fs.BoolVar(&dryRun, "dry-run", false, "show what would be deleted, delete nothing")
	case "ls":
		fs.BoolVar(&verify, "verify", false, "read every complete checkpoint and check every checksum (a VERIFIED column)")
	case "inspect":
		fs.BoolVar(&asJSON, "json", false, "print the manifest as JSON instead of a summary")
	}
	cmd.ValidArgsFunction = cobra.NoFileCompletions
	// Names and flags may come in any order.
	return withRun(cmd, func(ctx context.Context, names []string) error {
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
			return ckptList(ctx, store, verify, stdout)
		case "inspect":
			m, err := checkpoint.ReadManifest(ctx, store, names[0])
			if err != nil {
				return err
			}
			if !asJSON {
				return ckptSummary(ctx, store, m, stdout)
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
	})
}

func ckptList(ctx context.Context, store checkpoint.Store, verify bool, stdout io.Writer) error {
	infos, err := checkpoint.List(ctx, store)
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		fmt.Fprintf(stdout, "no checkpoints at %s\n", store.Location())
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	head := "NAME\tSTEP\tTIME\tSIZE\tWORLD\tSTATUS"
	if verify {
		head += "\tVERIFIED"
	}
	fmt.Fprintln(tw, head)
	for _, in := range infos {
		world, status, verified := "-", "incomplete (no manifest)", "-"
		if in.Complete {
			status = "complete"
			if m, err := checkpoint.ReadManifest(ctx, store, in.ID); err != nil {
				status = "unreadable manifest: " + err.Error()
				verified = "no"
			} else {
				world = fmt.Sprint(m.World)
				if verify {
					verified = "yes"
					if err := checkpoint.Verify(ctx, store, m); err != nil {
						verified = "NO: " + err.Error()
					}
				}
			}
		}
		line := fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%s", in.ID, in.Step, in.Modified.UTC().Format(time.RFC3339), bytesize.Format(in.Bytes), world, status)
		if verify {
			line += "\t" + verified
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// ckptSummary prints what a person asks of a checkpoint: where training
// was, who wrote it, what it holds, and whether its objects are all there.
func ckptSummary(ctx context.Context, store checkpoint.Store, m *phalanxpb.Manifest, stdout io.Writer) error {
	objs, err := store.List(ctx, m.Id+"/")
	if err != nil {
		return err
	}
	size := map[string]int64{}
	for _, o := range objs {
		size[o.Name] = o.Size
	}
	fmt.Fprintf(stdout, "checkpoint %s\n", m.Id)
	fmt.Fprintf(stdout, "  step %d (epoch %d, offset %d), sequence %d, written %s by %d workers in generation %d\n",
		m.Step, m.Epoch, m.Offset, m.Sequence, time.Unix(0, m.CreatedUnixNano).UTC().Format(time.RFC3339), m.World, m.Generation)
	if st := m.Stats; st != nil {
		fmt.Fprintf(stdout, "  loss %.4f, accuracy %.2f%%, %d samples in the step\n", st.Loss, 100*st.Accuracy, st.Samples)
	}
	fmt.Fprintf(stdout, "  job %s, seed %d; settings %s, state %s (what a resume must match)\n", m.Job, m.Seed, m.ConfigHash, m.StateHash)
	if m.Model != "" {
		var opts []string
		for _, k := range slices.Sorted(maps.Keys(m.ModelOptions)) {
			opts = append(opts, k+"="+m.ModelOptions[k])
		}
		fmt.Fprintf(stdout, "  model %s %s\n", m.Model, strings.Join(opts, " "))
	}
	fmt.Fprintf(stdout, "  %s in %d blocks of %s, each with a CRC32C\n", bytesize.Format(int64(m.TotalBytes)), len(m.BlockCrc32C), bytesize.Format(int64(m.BlockBytes)))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "TENSOR\tROLE\tSHAPE\tDTYPE\tBYTES\n")
	for _, t := range m.Tensors {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", t.Name, t.Role, t.Shape, t.Dtype, bytesize.Format(int64(t.Bytes)))
	}
	tw.Flush()
	fmt.Fprintf(tw, "OBJECT\tRANK\tBYTES\tSTATE\n")
	missing := 0
	for _, o := range m.Objects {
		state := "present"
		switch got, ok := size[m.Id+"/"+o.Name]; {
		case !ok:
			state, missing = "MISSING", missing+1
		case got != int64(o.Bytes):
			state, missing = fmt.Sprintf("WRONG SIZE: %d bytes in the store", got), missing+1
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", o.Name, o.Rank, bytesize.Format(int64(o.Bytes)), state)
	}
	tw.Flush()
	if missing > 0 {
		return fmt.Errorf("checkpoint %s: %d of %d objects missing or of the wrong size", m.Id, missing, len(m.Objects))
	}
	fmt.Fprintln(stdout, "(presence and sizes only: phalanx ckpt verify checks every byte)")
	return nil
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
