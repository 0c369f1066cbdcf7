package checkpoint

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// ErrNoCheckpoint is returned by Restore when a resume is required and the
// store holds no checkpoint.
var ErrNoCheckpoint = errors.New("no checkpoint to resume from")

// IncompatibleError is a checkpoint that belongs to another model or
// configuration: resuming from it is refused rather than guessed at.
type IncompatibleError struct {
	ID     string
	Reason string
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("checkpoint %s cannot be resumed by this job: %s", e.ID, e.Reason)
}

// Restored is what Restore loaded.
type Restored struct {
	Manifest *phalanxpb.Manifest
}

// candidate header kinds broadcast by rank 0.
const (
	hdrCandidate = iota
	hdrNone
	hdrError
)

// Restore loads the newest complete checkpoint of the store whose every
// block verifies into the tensors of every rank of the ring (Bind first): rank
// 0 chooses and sends the manifest, each rank reads and verifies its share
// of the blocks, and the ring gathers them. A checkpoint that fails to verify
// is reported (a "skipped" event naming it and why) and the previous one is
// tried. With none at all, Restore returns (nil, nil), or ErrNoCheckpoint
// when required.
func (c *Checkpointer) Restore(ctx context.Context, required bool) (*Restored, error) {
	g := c.ring.Group
	rank := g.Rank()
	var candidates []Info
	var listErr error
	if rank == 0 {
		all, err := List(ctx, c.cfg.Store)
		listErr = err
		for _, in := range all {
			if in.Complete {
				candidates = append(candidates, in)
			}
		}
	}
	hdr := make([]float64, 2)
	var stream []byte
	for {
		var body []byte
		if rank == 0 {
			hdr[0], hdr[1] = hdrNone, 0
			if listErr != nil {
				body = []byte(listErr.Error())
				hdr[0] = hdrError
			}
			for listErr == nil && len(candidates) > 0 {
				in := candidates[0]
				candidates = candidates[1:]
				m, err := ReadManifest(ctx, c.cfg.Store, in.ID)
				if err != nil {
					c.skip(in.ID, err)
					continue
				}
				body, _ = proto.Marshal(m)
				hdr[0] = hdrCandidate
				break
			}
			hdr[1] = float64(len(body))
		}
		if err := g.Broadcast(ctx, collective.Float64s(hdr), 0); err != nil {
			return nil, fmt.Errorf("checkpoint: choosing the checkpoint to resume from: %w", err)
		}
		if hdr[1] < 0 || hdr[1] > maxManifestBytes {
			return nil, fmt.Errorf("checkpoint: rank 0 announced a manifest of %v bytes", hdr[1])
		}
		if rank != 0 {
			body = make([]byte, int(hdr[1]))
		}
		if err := g.Broadcast(ctx, collective.Bytes(body), 0); err != nil {
			return nil, fmt.Errorf("checkpoint: receiving the manifest: %w", err)
		}
		switch hdr[0] {
		case hdrNone:
			if required {
				return nil, fmt.Errorf("checkpoint: %s: %w", c.cfg.Store.Location(), ErrNoCheckpoint)
			}
			return nil, nil
		case hdrError:
			return nil, fmt.Errorf("checkpoint: listing %s: %s", c.cfg.Store.Location(), body)
		}
		m, err := DecodeManifest("", body)
		if err != nil {
			return nil, err
		}
		if err := Compatible(m, c.tensors); err != nil {
			return nil, &IncompatibleError{m.Id, err.Error()}
		}
		if c.cfg.StateHash != "" && m.StateHash != c.cfg.StateHash {
			return nil, &IncompatibleError{m.Id, fmt.Sprintf("it was written with model, optimizer or data flags of hash %s; this job's are %s", m.StateHash, c.cfg.StateHash)}
		}
		if stream == nil || int64(len(stream)) != int64(m.TotalBytes) {
			stream = make([]byte, m.TotalBytes)
		}
		ok, err := c.load(ctx, m, stream)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		copyIn(c.tensors, c.offsets, 0, stream)
		c.seq, c.lastSaved, c.lastStart = m.Sequence, m.Step, c.cfg.Now()
		if m.ConfigHash != c.cfg.ConfigHash && rank == 0 {
			c.log.Warn("resuming a checkpoint written with other training flags (learning rate, steps, batch...)",
				zap.String("checkpoint", m.Id), zap.String("its_flags", m.ConfigHash), zap.String("ours", c.cfg.ConfigHash))
		}
		if rank == 0 {
			c.cfg.OnEvent(Event{Kind: "restored", ID: m.Id, Step: m.Step, URL: c.cfg.Store.Location() + "/" + m.Id,
				WorldBefore: int(m.World), WorldAfter: g.Size(), Bytes: int64(m.TotalBytes)})
		}
		return &Restored{Manifest: m}, nil
	}
}

func (c *Checkpointer) skip(id string, err error) {
	c.log.Warn("checkpoint skipped", zap.String("checkpoint", id), zap.Error(err))
	c.cfg.OnEvent(Event{Kind: "skipped", ID: id, Err: err.Error()})
}

// load reads this rank's share of m's blocks, verifies them, and gathers the
// whole stream from every rank's share; ok is false (on every rank) when any
// rank's share did not verify.
func (c *Checkpointer) load(ctx context.Context, m *phalanxpb.Manifest, stream []byte) (ok bool, err error) {
	g := c.ring.Group
	total := int64(m.TotalBytes)
	lo, hi := collective.ShardRange(len(stream), g.Size(), g.Rank())
	// Whole blocks around the share, so that each can be verified.
	bs := int64(m.BlockBytes)
	a, z := int64(lo)/bs*bs, min((int64(hi)+bs-1)/bs*bs, total)
	var bad error
	if lo < hi {
		buf := stream[a:z]
		if err := readRange(ctx, c.cfg.Store, m, a, z, buf, c.cfg.Backoff); err != nil {
			bad = err
		} else if err := verifyBlocks(m, a, z, buf); err != nil {
			bad = err
		}
	}
	flag := []float32{0}
	if bad != nil {
		flag[0] = 1
		c.skip(m.Id, bad)
	}
	if err := g.AllReduce(ctx, collective.Float32s(flag), collective.Max); err != nil {
		return false, fmt.Errorf("checkpoint %s: agreeing on its verification: %w", m.Id, err)
	}
	if flag[0] != 0 {
		return false, nil
	}
	if err := g.AllGatherInPlace(ctx, collective.Bytes(stream)); err != nil {
		return false, fmt.Errorf("checkpoint %s: gathering the state: %w", m.Id, err)
	}
	// Every block was verified by the rank that read it; the tensors'
	// checksums now check the manifest's own consistency, on every rank.
	for _, t := range m.Tensors {
		if got := crc(stream[t.Offset : t.Offset+t.Bytes]); got != t.Crc32C {
			bad = &CorruptError{ID: m.Id, Object: objectAt(m, int64(t.Offset)), What: "tensor " + t.Name,
				Reason: fmt.Sprintf("checksum %08x, want %08x", got, t.Crc32C)}
			break
		}
	}
	flag[0] = 0
	if bad != nil {
		flag[0] = 1
		if g.Rank() == 0 {
			c.skip(m.Id, bad)
		}
	}
	if err := g.AllReduce(ctx, collective.Float32s(flag), collective.Max); err != nil {
		return false, fmt.Errorf("checkpoint %s: agreeing on its verification: %w", m.Id, err)
	}
	return flag[0] == 0, nil
}
