package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/plant"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/trace"
)

// Votes are a rank's say in checkpoint decisions (a checkpoint now, a stop),
// summed over the ranks by the step's own allreduce (worker.Trainer carries
// them), so that every rank takes the same decision at the same step boundary.
type Votes = [4]float32

// The meaning of each vote.
const (
	VoteWant   = iota // rank 0: the --checkpoint-every period has passed
	VoteStop          // this rank was asked to stop (SIGTERM): checkpoint, then every rank stops
	VoteDone          // this rank stored its shard of the checkpoint in flight
	VoteFailed        // this rank could not store it
)

// Config configures a Checkpointer.
type Config struct {
	Store      Store
	Job        string
	ConfigHash string // the training settings; a resume under others is warned about
	StateHash  string // the flags that give the state its meaning; a resume requires the same
	// Model and ModelOptions name the registered model that writes the
	// state, and its options, for readers that rebuild it (phalanx sample).
	Model        string
	ModelOptions map[string]string
	Seed         uint64
	EverySteps   int64         // checkpoint every this many steps (0: not by steps)
	Every        time.Duration // and/or this often (0: not by time)
	Retention    Retention
	// Wait bounds how long training waits for the previous checkpoint's
	// upload when the next is due (back-pressure), and for the final one:
	// after it the upload is abandoned and the checkpoint reported failed.
	Wait time.Duration
	// BlockBytes is the checksum block size (default: 1 MiB, smaller for a
	// small state so that every rank has blocks to write).
	BlockBytes int
	// SingleWriter has rank 0 store the whole state: for when the ranks'
	// states are not identical (local SGD between averagings).
	SingleWriter bool
	Backoff      Backoff
	Now          func() time.Time
	Logger       *zap.Logger
	// OnEvent is told of every checkpoint saved, failed, skipped or
	// restored; the ranks each report what they alone know.
	OnEvent func(Event)
	// Trace records the rank's snapshots (on the step's thread: they stop
	// the step), its uploads and its manifests (nil: none).
	Trace *trace.Recorder
}

// Event is a checkpoint event for the job's log.
type Event struct {
	Kind        string  `json:"kind"` // "saved", "failed", "skipped" or "restored"
	ID          string  `json:"id,omitempty"`
	URL         string  `json:"url,omitempty"`
	Step        int64   `json:"step"`
	Bytes       int64   `json:"bytes,omitempty"`
	Seconds     float64 `json:"seconds,omitempty"`
	Err         string  `json:"error,omitempty"`
	WorldBefore int     `json:"world_before,omitempty"`
	WorldAfter  int     `json:"world_after,omitempty"`
	// ManifestCRC (saved): the CRC32C of the manifest as written, so that
	// whoever heard of the checkpoint can tell later that it is unchanged.
	ManifestCRC uint32 `json:"manifest_crc32c,omitempty"`
	// ConfigChanged (restored): the checkpoint was written under other
	// training settings (Config.ConfigHash): a warning, not a refusal.
	ConfigChanged bool `json:"config_changed,omitempty"`
}

// Ring is the group a Checkpointer saves from: one generation's ring.
type Ring struct {
	Group      *collective.Group
	Generation uint64
	Decided    int64 // the generation's decision time, unix nanoseconds: part of its checkpoints' names
}

// Progress is where training stands at a step boundary.
type Progress struct {
	Step, Epoch, Offset int64
	Loss, Accuracy      float64
	Samples             int64
}

// Checkpointer saves a rank's training state periodically and restores it.
// Its methods are called from the training loop's goroutine; uploads run on a
// goroutine of its own, one at a time.
type Checkpointer struct {
	cfg     Config
	log     *zap.Logger
	tensors []Tensor
	offsets []int64
	ring    Ring

	tasks   chan func()
	bg      context.Context
	stopBg  context.CancelFunc
	workers sync.WaitGroup

	cur       *inflight // the checkpoint whose upload is not yet resolved
	snap      []byte    // this rank's share of the last snapshot, reused
	loadBuf   []byte    // this rank's share of a restored checkpoint
	lastStart time.Time
	lastSaved int64 // step of the last checkpoint started or restored (-1: none)
	seq       uint64
	stopReq   atomic.Bool
}

// inflight is a checkpoint between its snapshot and its resolution.
type inflight struct {
	id       string
	step     int64
	gen      uint64
	rank     int
	world    int
	cancel   context.CancelFunc
	done     chan struct{}
	err      error                 // this rank's upload, set before done closes
	manifest *phalanxpb.Manifest   // its layout; rank 0 fills in the checksums
	index    *phalanxpb.ShardIndex // this rank's shard's checksums
	start    time.Time
}

// New returns a Checkpointer for the state held in tensors (whose Data
// slices must stay the live state).
func New(cfg Config, tensors []Tensor) (*Checkpointer, error) {
	var probe [2]byte
	binary.NativeEndian.PutUint16(probe[:], 1)
	switch {
	case probe[0] != 1:
		return nil, errors.New("checkpoint: the state is stored little-endian, as it is in memory: this machine is big-endian")
	case cfg.Store == nil:
		return nil, errors.New("checkpoint: no store")
	case cfg.EverySteps < 0 || cfg.Every < 0 || cfg.Wait < 0 || cfg.BlockBytes < 0 || cfg.BlockBytes%4 != 0:
		return nil, errors.New("checkpoint: periods, the wait bound and the block size must not be negative (and blocks a multiple of 4 bytes)")
	case cfg.Retention.KeepLast < 0 || cfg.Retention.KeepEvery < 0:
		return nil, errors.New("checkpoint: retention counts must not be negative")
	}
	if cfg.Wait == 0 {
		cfg.Wait = 5 * time.Minute
	}
	if cfg.Backoff == (Backoff{}) {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.OnEvent == nil {
		cfg.OnEvent = func(Event) {}
	}
	c := &Checkpointer{cfg: cfg, log: cfg.Logger, tensors: tensors, tasks: make(chan func(), 4), lastSaved: -1}
	c.offsets = newLayout(tensors, 4, 1).offsets
	c.bg, c.stopBg = context.WithCancel(context.Background())
	c.lastStart = cfg.Now()
	c.workers.Add(1)
	go func() {
		defer c.workers.Done()
		for t := range c.tasks {
			t()
		}
	}()
	return c, nil
}

// Resumed tells the Checkpointer its tensors were loaded from elsewhere
// (another kind's checkpoint) at step: the schedule counts from there, as
// after Restore.
func (c *Checkpointer) Resumed(step int64) {
	c.lastSaved, c.lastStart = step, c.cfg.Now()
}

// Location is the store's URL.
func (c *Checkpointer) Location() string { return c.cfg.Store.Location() }

// Bind moves the Checkpointer to a new ring (a new generation). A checkpoint
// not yet stored by every rank of the old ring is abandoned.
func (c *Checkpointer) Bind(r Ring) {
	if c.cur != nil && c.cur.gen != r.Generation {
		c.abandon(fmt.Sprintf("abandoned: the ring changed (generation %d)", r.Generation))
	}
	c.ring = r
}

func (c *Checkpointer) abandon(reason string) {
	cur := c.cur
	c.cur = nil
	cur.cancel()
	<-cur.done
	if cur.rank == 0 {
		c.cfg.OnEvent(Event{Kind: "failed", ID: cur.id, Step: cur.step, Err: reason})
	}
}

// RequestStop asks for a final checkpoint and a stop at the next step
// boundary (graceful preemption); safe from any goroutine.
func (c *Checkpointer) RequestStop() { c.stopReq.Store(true) }

// StopRequested reports whether RequestStop was called.
func (c *Checkpointer) StopRequested() bool { return c.stopReq.Load() }

// Votes is this rank's say for the step being finished.
func (c *Checkpointer) Votes() (v Votes) {
	if c.stopReq.Load() {
		v[VoteStop] = 1
	}
	if c.ring.Group != nil && c.ring.Group.Rank() == 0 && c.cfg.Every > 0 && c.cfg.Now().Sub(c.lastStart) >= c.cfg.Every {
		v[VoteWant] = 1
	}
	if cur := c.cur; cur != nil {
		select {
		case <-cur.done:
			if cur.err != nil {
				v[VoteFailed] = 1
			} else {
				v[VoteDone] = 1
			}
		default:
		}
	}
	return v
}

// AfterStep is called at every step boundary with the step's summed votes.
// It settles the checkpoint in flight when every rank has voted on it,
// starts a checkpoint when one is due (waiting, within Config.Wait, for the
// previous upload first), and at the job's last step or on a stop request
// saves synchronously. stop reports that every rank must stop now.
func (c *Checkpointer) AfterStep(ctx context.Context, p Progress, sums Votes, last bool) (stop bool, err error) {
	if c.cur != nil {
		c.resolve(sums[VoteDone], sums[VoteFailed])
	}
	stop = sums[VoteStop] > 0
	due := stop || last || sums[VoteWant] > 0 || (c.cfg.EverySteps > 0 && p.Step%c.cfg.EverySteps == 0)
	if !due || p.Step == c.lastSaved {
		return stop, nil
	}
	if c.cur != nil {
		if err := c.settle(ctx); err != nil {
			return stop, err
		}
	}
	c.start(p)
	if stop || last {
		if err := c.settle(ctx); err != nil {
			return stop, err
		}
		if err := c.Flush(ctx); err != nil {
			return stop, err
		}
	}
	return stop, nil
}

// resolve settles the checkpoint in flight by the ranks' votes: stored by
// all, its manifest is written (rank 0); failed anywhere, it is dropped.
func (c *Checkpointer) resolve(done, failed float32) {
	cur := c.cur
	switch {
	case failed > 0:
		c.cur = nil
		cur.cancel() // this rank's upload may still run; its snapshot is about to be reused
		<-cur.done
		if cur.rank == 0 {
			reason := fmt.Sprintf("%v of %d ranks could not store their shards (their logs say why)", failed, cur.world)
			if cur.err != nil {
				reason = cur.err.Error()
			}
			c.cfg.OnEvent(Event{Kind: "failed", ID: cur.id, Step: cur.step, Err: reason})
		} else if cur.err != nil {
			c.log.Warn("checkpoint shard not stored", zap.String("checkpoint", cur.id), zap.Error(cur.err))
		}
	case int(done) == cur.world:
		c.cur = nil
		if cur.rank == 0 {
			c.commit(cur)
		}
	}
}

// settle waits (within Config.Wait) for this rank's upload of the
// checkpoint in flight, then has the ranks vote on it at once.
func (c *Checkpointer) settle(ctx context.Context) error {
	cur := c.cur
	t := time.NewTimer(c.cfg.Wait)
	select {
	case <-cur.done:
	case <-t.C:
		cur.cancel()
		<-cur.done
		if cur.err == nil || errors.Is(cur.err, context.Canceled) {
			cur.err = fmt.Errorf("checkpoint %s: the upload did not finish within the back-pressure bound of %v", cur.id, c.cfg.Wait)
		}
	case <-ctx.Done():
		t.Stop()
		return context.Cause(ctx)
	}
	t.Stop()
	v := []float32{0, 0}
	if cur.err != nil {
		v[1] = 1
	} else {
		v[0] = 1
	}
	if err := c.ring.Group.AllReduce(ctx, collective.Float32s(v), collective.Sum); err != nil {
		return fmt.Errorf("checkpoint %s: voting on the upload: %w", cur.id, err)
	}
	c.resolve(v[0], v[1])
	return nil
}

// start snapshots the state and queues this rank's upload.
func (c *Checkpointer) start(p Progress) {
	g := c.ring.Group
	rank, world := g.Rank(), g.Size()
	writers := world
	if c.cfg.SingleWriter {
		writers = 1
	}
	l := newLayout(c.tensors, blockBytes(c.cfg.BlockBytes, c.offsets[len(c.tensors)], writers), writers)
	lo, hi := int64(0), int64(0)
	if rank < writers {
		lo, hi = l.objectRange(rank)
	}
	if int64(cap(c.snap)) < hi-lo {
		c.snap = make([]byte, hi-lo)
	}
	data := c.snap[:hi-lo]
	began := time.Now()
	copyOut(c.tensors, c.offsets, lo, hi, data)
	c.cfg.Trace.Span(trace.ThreadStep, "checkpoint snapshot", began, time.Now(), trace.Args{Step: p.Step, Bytes: len(data), Rank: -1})

	c.seq++
	now := c.cfg.Now()
	id := NewID(p.Step, c.ring.Generation, c.ring.Decided)
	uctx, cancel := context.WithCancel(c.bg)
	cur := &inflight{id: id, step: p.Step, gen: c.ring.Generation, rank: rank, world: world, cancel: cancel,
		done: make(chan struct{}), start: now}
	c.cur, c.lastStart, c.lastSaved = cur, now, p.Step
	cur.manifest = skeleton(Meta{ID: id, Job: c.cfg.Job, Step: p.Step, Epoch: p.Epoch, Offset: p.Offset, Seed: c.cfg.Seed, World: world,
		Generation: c.ring.Generation, ConfigHash: c.cfg.ConfigHash, StateHash: c.cfg.StateHash, Created: now.UnixNano(),
		Model: c.cfg.Model, ModelOptions: c.cfg.ModelOptions,
		Sequence: c.seq, Loss: p.Loss, Accuracy: p.Accuracy, Samples: p.Samples}, c.tensors, l)
	k := objectFor(cur.manifest, rank)
	c.tasks <- func() {
		defer close(cur.done)
		if k < 0 {
			return // nothing of the state falls to this rank
		}
		began := time.Now()
		defer func() {
			c.cfg.Trace.Span(trace.ThreadCheckpoint, "checkpoint upload", began, time.Now(), trace.Args{Step: p.Step, Bytes: len(data), Rank: -1})
		}()
		m := cur.manifest
		cur.index = indexShard(m, k, data)
		idx, err := proto.Marshal(cur.index)
		if err != nil {
			cur.err = err
			return
		}
		name := id + "/" + m.Objects[k].Name
		for _, obj := range []struct {
			name string
			b    []byte
		}{{name, plantCorrupt(p.Step, k, data)}, {indexName(name), idx}} { // the shard, then its index
			cur.err = c.cfg.Backoff.do(uctx, func(ctx context.Context) error {
				return c.cfg.Store.Put(ctx, obj.name, obj.b)
			}, func(attempt int, err error) {
				c.log.Warn("checkpoint upload failed; retrying", zap.String("object", obj.name), zap.Int("attempt", attempt), zap.Error(err))
			})
			if cur.err != nil {
				return
			}
		}
	}
}

// CheckpointURL names checkpoint id of store for people:
// s3://bucket/prefix/id?endpoint=... or dir/id.
func CheckpointURL(s Store, id string) string {
	loc := s.Location()
	if base, query, ok := strings.Cut(loc, "?"); ok {
		return base + "/" + id + "?" + query
	}
	return loc + "/" + id
}

// blockBytes is the configured block size, or one that gives each writer
// about 16 blocks: at least 4 KiB, at most DefaultBlockBytes.
func blockBytes(configured int, total int64, writers int) int64 {
	if configured > 0 {
		return int64(configured)
	}
	b := (total/int64(writers*16) + 4095) / 4096 * 4096
	return min(max(b, 4096), DefaultBlockBytes)
}

// commit queues the manifest of a checkpoint every rank has stored, then
// the retention policy.
func (c *Checkpointer) commit(cur *inflight) {
	c.tasks <- func() {
		ctx, cancel := context.WithTimeout(c.bg, c.cfg.Wait)
		defer cancel()
		began := time.Now()
		defer func() {
			c.cfg.Trace.Span(trace.ThreadCheckpoint, "checkpoint manifest", began, time.Now(), trace.Args{Step: cur.step, Rank: -1})
		}()
		m := cur.manifest
		err := c.gatherIndexes(ctx, cur)
		var b []byte
		if err == nil {
			b, err = EncodeManifest(m)
		}
		if err == nil {
			err = c.cfg.Backoff.do(ctx, func(ctx context.Context) error {
				return c.cfg.Store.Put(ctx, cur.id+"/"+ManifestName, b)
			}, func(attempt int, err error) {
				c.log.Warn("checkpoint manifest upload failed; retrying", zap.String("checkpoint", cur.id), zap.Int("attempt", attempt), zap.Error(err))
			})
		}
		if err != nil {
			c.cfg.OnEvent(Event{Kind: "failed", ID: cur.id, Step: cur.step, Err: "writing the manifest: " + err.Error()})
			return
		}
		c.cfg.OnEvent(Event{Kind: "saved", ID: cur.id, Step: cur.step, Bytes: int64(m.TotalBytes) + int64(len(b)),
			Seconds: c.cfg.Now().Sub(cur.start).Seconds(), URL: CheckpointURL(c.cfg.Store, cur.id), WorldAfter: int(m.World), ManifestCRC: crc(b)})
		if plant.Enabled {
			if err := c.plantRewrite(ctx, cur); err != nil {
				c.log.Warn("planted rewrite", zap.Error(err))
			}
		}
		if c.cfg.Retention.KeepLast > 0 {
			gone, err := c.cfg.Retention.Retain(ctx, c.cfg.Store)
			if err != nil {
				c.log.Warn("checkpoint retention", zap.Error(err))
			}
			for _, id := range gone {
				c.log.Info("checkpoint deleted by the retention policy", zap.String("checkpoint", id))
			}
		}
	}
}

// gatherIndexes fills rank 0's manifest with the checksums of every
// shard: its own from memory, the others' from the index each rank stored
// after its shard.
func (c *Checkpointer) gatherIndexes(ctx context.Context, cur *inflight) error {
	m := cur.manifest
	for k, o := range m.Objects {
		x := cur.index
		if o.Rank != 0 || x == nil {
			name := cur.id + "/" + indexName(o.Name)
			var b []byte
			err := c.cfg.Backoff.do(ctx, func(ctx context.Context) (err error) {
				b, err = readSmall(ctx, c.cfg.Store, name)
				return err
			}, nil)
			if err != nil {
				return fmt.Errorf("the index of %s: %w", o.Name, err)
			}
			x = &phalanxpb.ShardIndex{}
			if err := proto.Unmarshal(b, x); err != nil {
				return fmt.Errorf("the index %s: %w", name, err)
			}
		}
		if err := fillShard(m, k, x); err != nil {
			return err
		}
	}
	return validate(m)
}

// SaveAlone writes a whole checkpoint from this rank alone, synchronously,
// without a ring: for a worker left without one (the job stopped below its
// minimum) whose state is the job's last commit. Generation names the
// checkpoint with the current time.
func (c *Checkpointer) SaveAlone(ctx context.Context, p Progress, generation uint64) (id string, err error) {
	if c.cur != nil {
		c.abandon("abandoned: the ring is gone")
	}
	if err := c.Flush(ctx); err != nil {
		return "", err
	}
	l := newLayout(c.tensors, blockBytes(c.cfg.BlockBytes, c.offsets[len(c.tensors)], 1), 1)
	data := make([]byte, l.total)
	copyOut(c.tensors, c.offsets, 0, l.total, data)
	c.seq++
	now := c.cfg.Now()
	id = NewID(p.Step, generation, now.UnixNano())
	m := skeleton(Meta{ID: id, Job: c.cfg.Job, Step: p.Step, Epoch: p.Epoch, Offset: p.Offset, Seed: c.cfg.Seed, World: 1,
		Generation: generation, ConfigHash: c.cfg.ConfigHash, StateHash: c.cfg.StateHash, Created: now.UnixNano(),
		Model: c.cfg.Model, ModelOptions: c.cfg.ModelOptions,
		Sequence: c.seq, Loss: p.Loss, Accuracy: p.Accuracy, Samples: p.Samples}, c.tensors, l)
	if len(m.Objects) == 1 {
		if err := fillShard(m, 0, indexShard(m, 0, data)); err != nil {
			return "", err
		}
	}
	mb, err := EncodeManifest(m)
	if err != nil {
		return "", err
	}
	names, bodies := []string{id + "/" + ManifestName}, [][]byte{mb}
	if len(m.Objects) == 1 { // the shard first, the manifest last
		names, bodies = append([]string{id + "/" + m.Objects[0].Name}, names...), append([][]byte{data}, bodies...)
	}
	for i, name := range names {
		if err := c.cfg.Backoff.do(ctx, func(ctx context.Context) error { return c.cfg.Store.Put(ctx, name, bodies[i]) }, nil); err != nil {
			c.cfg.OnEvent(Event{Kind: "failed", ID: id, Step: p.Step, Err: err.Error()})
			return "", err
		}
	}
	c.cfg.OnEvent(Event{Kind: "saved", ID: id, Step: p.Step, Bytes: int64(len(data) + len(mb)), Seconds: c.cfg.Now().Sub(now).Seconds(),
		URL: CheckpointURL(c.cfg.Store, id), WorldAfter: 1, ManifestCRC: crc(mb)})
	return id, nil
}

// Flush waits until every queued upload and manifest is written.
func (c *Checkpointer) Flush(ctx context.Context) error {
	done := make(chan struct{})
	select {
	case c.tasks <- func() { close(done) }:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Close abandons a checkpoint not yet stored by every rank, waits for the
// queued manifests (within ctx) and stops the upload goroutine.
func (c *Checkpointer) Close(ctx context.Context) error {
	if c.cur != nil {
		c.abandon("abandoned: the worker stopped")
	}
	err := c.Flush(ctx)
	c.stopBg()
	close(c.tasks)
	c.workers.Wait()
	return err
}
