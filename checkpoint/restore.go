package checkpoint

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

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
	hdr := make([]float64, 3) // kind, manifest length, checkpoints skipped by rank 0
	skipped, tried := 0, 0
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
					skipped++
					continue
				}
				body, _ = EncodeManifest(m)
				hdr[0] = hdrCandidate
				break
			}
			hdr[1], hdr[2] = float64(len(body)), float64(skipped)
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
			if n := int(hdr[2]) + tried; n > 0 {
				// Starting afresh would train over a state partly loaded,
				// and later overwrite what may be repairable.
				return nil, fmt.Errorf("checkpoint: %s holds checkpoints but none of the %d tried verifies (each was reported); "+
					"repair or remove them (phalanx ckpt verify, phalanx ckpt rm) or start with another --checkpoint location", c.cfg.Store.Location(), n)
			}
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
		tried++
		ok, err := c.load(ctx, m)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		c.seq, c.lastSaved, c.lastStart = m.Sequence, m.Step, c.cfg.Now()
		changed := m.ConfigHash != c.cfg.ConfigHash
		if changed && rank == 0 {
			c.log.Warn("resuming a checkpoint written with other training settings (batch, optimizer, clipping, synchronisation...)",
				zap.String("checkpoint", m.Id), zap.String("its_settings", m.ConfigHash), zap.String("ours", c.cfg.ConfigHash))
		}
		if rank == 0 {
			c.cfg.OnEvent(Event{Kind: "restored", ID: m.Id, Step: m.Step, URL: CheckpointURL(c.cfg.Store, m.Id),
				WorldBefore: int(m.World), WorldAfter: g.Size(), Bytes: int64(m.TotalBytes), ConfigChanged: changed})
		}
		return &Restored{Manifest: m}, nil
	}
}

func (c *Checkpointer) skip(id string, err error) {
	c.log.Warn("checkpoint skipped", zap.String("checkpoint", id), zap.Error(err))
	c.cfg.OnEvent(Event{Kind: "skipped", ID: id, Err: err.Error()})
}

// load reads this rank's share of m's state, verifies its blocks, writes it
// into the tensors, and gathers every other rank's share into them over the
// data plane; ok is false (on every rank) when any rank's share did not
// verify. No buffer of the whole state is allocated: each rank holds one of
// its share.
func (c *Checkpointer) load(ctx context.Context, m *phalanxpb.Manifest) (ok bool, err error) {
	g := c.ring.Group
	world := g.Size()
	total := int64(m.TotalBytes)
	share := func(r int) (int64, int64) { // whole float32 elements
		lo, hi := collective.ShardRange(int(total/4), world, r)
		return int64(lo) * 4, int64(hi) * 4
	}
	lo, hi := share(g.Rank())
	// Whole blocks around the share, so that each can be verified.
	bs := int64(m.BlockBytes)
	a, z := lo/bs*bs, min((hi+bs-1)/bs*bs, total)
	var bad error
	if lo < hi {
		if int64(cap(c.loadBuf)) < z-a {
			c.loadBuf = make([]byte, z-a)
		}
		buf := c.loadBuf[:z-a]
		if err := readRange(ctx, c.cfg.Store, m, a, z, buf, c.cfg.Backoff); err != nil {
			bad = err
		} else if err := verifyBlocks(m, a, z, buf); err != nil {
			bad = err
		} else {
			copyIn(c.tensors, c.offsets, lo, buf[lo-a:hi-a])
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
	// Every byte was in a block its reader verified; the data plane is
	// reliable and framed. Each tensor is gathered in place.
	cuts := make([]int, world+1)
	for i, t := range c.tensors {
		t0, t1 := c.offsets[i], c.offsets[i+1]
		for r := range world {
			rlo, _ := share(r)
			cuts[r] = int(min(max(rlo, t0), t1)-t0) / 4
		}
		cuts[world] = int(t1-t0) / 4
		if err := g.AllGatherRanges(ctx, collective.Float32s(t.Data), cuts); err != nil {
			return false, fmt.Errorf("checkpoint %s: gathering %s: %w", m.Id, t.Name, err)
		}
	}
	return true, nil
}
