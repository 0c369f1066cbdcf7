package pipeline

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/elastic"
	"github.com/phalanx-rt/phalanx/job/pipeline/layout"
	"github.com/phalanx-rt/phalanx/worker"
)

// Copies in peers' memory (after Gemini): a pipeline of one replica keeps,
// every CommitEvery steps, a commit of each stage's state in its own
// memory and sends a copy to the next stage ((s+1) mod P) on a link of its
// own, off the critical path. When a stage's process dies, its replacement
// receives the copy its neighbour holds and the others roll back to their
// own commit of the same step: at most CommitEvery steps are redone, and
// no checkpoint is read. Two commits of each are kept, so that a copy
// still in flight when the stage died leaves the one before usable.

// commit is a stage's state after a step: its tensors flattened in
// stageTensors order, and the sampler's position.
type commit struct {
	stage              int // the stage whose state it is
	step, epoch, offst int64
	data               []float32
	sending            atomic.Bool // the copier is sending it: not to be overwritten
}

// commits are what a worker keeps: its own stage's last two commits, and
// the last two it received of the previous stage's.
type commits struct {
	mu   sync.Mutex
	own  [2]*commit
	peer [2]*commit
}

// take commits st's state after step into the older of own's two; nil
// (no commit this time) while that one is still being sent.
func (c *commits) take(st *stageState, step int64, pos worker.Position) *commit {
	c.mu.Lock()
	defer c.mu.Unlock()
	slot := c.own[1]
	if slot == nil {
		slot = &commit{}
	}
	if slot.sending.Load() {
		return nil
	}
	slot.stage, slot.step, slot.epoch, slot.offst = st.stage, step, pos.Epoch, pos.Offset
	slot.data = slot.data[:0]
	for _, t := range stageTensors(st) {
		slot.data = append(slot.data, t.Data...)
	}
	c.own[1], c.own[0] = c.own[0], slot
	return slot
}

// received keeps a copy of the previous stage's commit.
func (c *commits) received(cm *commit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.peer[1], c.peer[0] = c.peer[0], cm
}

// find is the commit of stage's state at step among own and peer ones.
func (c *commits) find(stage int, step int64) *commit {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cm := range append(c.own[:], c.peer[:]...) {
		if cm != nil && cm.stage == stage && cm.step == step {
			return cm
		}
	}
	return nil
}

// statement is a member's commits as the restore plan sees them: for its
// own stage and the peer stage it holds, the steps it has.
func (c *commits) statement(gen, stateGen uint64) []float64 {
	out := []float64{-1, -1, -1, -1, -1, -1}
	if gen == 0 || gen != stateGen {
		return out
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, cm := range c.own {
		if cm != nil {
			out[0], out[1+i] = float64(cm.stage), float64(cm.step)
		}
	}
	for i, cm := range c.peer {
		if cm != nil {
			out[3], out[4+i] = float64(cm.stage), float64(cm.step)
		}
	}
	return out
}

// load overwrites st's state (and returns the position) from cm.
func (cm *commit) load(st *stageState) (worker.Position, error) {
	at := 0
	for _, t := range stageTensors(st) {
		if at+len(t.Data) > len(cm.data) {
			return worker.Position{}, fmt.Errorf("pipeline: the commit of stage %d at step %d holds %d values, the stage more", cm.stage, cm.step, len(cm.data))
		}
		copy(t.Data, cm.data[at:at+len(t.Data)])
		at += len(t.Data)
	}
	if at != len(cm.data) {
		return worker.Position{}, fmt.Errorf("pipeline: the commit of stage %d at step %d holds %d values, the stage %d", cm.stage, cm.step, len(cm.data), at)
	}
	return worker.Position{Epoch: cm.epoch, Offset: cm.offst}, nil
}

// copier sends a stage's commits to the next stage and receives the
// previous stage's, each on a two-rank group of its own.
type copier struct {
	out, in *collective.Group
	queue   chan *commit // to send, one at a time, from the commit itself
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// startCopier joins the copy links of stage me.Stage in round r and
// starts sending and receiving.
func (w *pipeWorker) startCopier(ctx context.Context, r *elastic.Round, lay layout.Layout, me layout.Place) (*copier, error) {
	p := w.cfg.Pipeline.Stages
	next, prev := (me.Stage+1)%p, (me.Stage+p-1)%p
	g := r.Generation
	addr := func(s int) string { return g.Members[lay.Ranks[me.Replica][s]].DataAddr }
	opts := collective.Options{Timeout: w.cfg.OpTimeout, Logger: w.log}
	join := func(from, to, rank int) (*collective.Group, error) {
		m := collective.Membership{Job: fmt.Sprintf("%s/pp/copy.%d>%d", w.cfg.Job, from, to), Generation: g.Number, Rank: rank,
			Peers: []string{addr(from), addr(to)}}
		return collective.Join(ctx, w.data, m, opts)
	}
	c := &copier{queue: make(chan *commit, 1)}
	var errs [2]error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.out, errs[0] = join(me.Stage, next, 0) }()
	go func() { defer wg.Done(); c.in, errs[1] = join(prev, me.Stage, 1) }()
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		c.close()
		return nil, fmt.Errorf("pipeline: the commit copy links: %v; %v", errs[0], errs[1])
	}
	cctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Add(2)
	go c.send(cctx, w.log)
	go c.receive(cctx, w.commits, w.log)
	return c, nil
}

// offer hands a commit to the sender, unless it is still sending one
// (then this one is not copied: a restore takes an older step, or the
// checkpoint). The commit is sent as it is, not copied again: take leaves
// it alone until it is sent.
func (c *copier) offer(cm *commit) {
	if cm == nil || len(c.queue) > 0 || !cm.sending.CompareAndSwap(false, true) {
		return
	}
	select {
	case c.queue <- cm:
	default:
		cm.sending.Store(false)
	}
}

func (c *copier) send(ctx context.Context, log *zap.Logger) {
	defer c.wg.Done()
	head := make([]float64, 5)
	for {
		var cm *commit
		select {
		case cm = <-c.queue:
		case <-ctx.Done():
			return
		}
		head[0], head[1], head[2], head[3], head[4] = float64(cm.stage), float64(cm.step), float64(cm.epoch), float64(cm.offst), float64(len(cm.data))
		err := c.out.Send(ctx, 1, collective.Float64s(head))
		if err == nil {
			err = c.out.Send(ctx, 1, collective.Float32s(cm.data))
		}
		cm.sending.Store(false)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("sending a commit to the next stage", zap.Error(err))
			}
			return
		}
	}
}

func (c *copier) receive(ctx context.Context, keep *commits, log *zap.Logger) {
	defer c.wg.Done()
	head := make([]float64, 5)
	var spare *commit
	for {
		if err := c.in.Recv(ctx, 0, collective.Float64s(head)); err != nil {
			if ctx.Err() == nil {
				log.Debug("receiving a commit from the previous stage", zap.Error(err))
			}
			return
		}
		n := int(head[4])
		if n < 0 || n > 1<<31 {
			log.Warn("a commit copy of a bad size", zap.Int("values", n))
			return
		}
		cm := spare
		if cm == nil {
			cm = &commit{}
		}
		if cap(cm.data) < n {
			cm.data = make([]float32, n)
		}
		cm.data = cm.data[:n]
		if err := c.in.Recv(ctx, 0, collective.Float32s(cm.data)); err != nil {
			return
		}
		cm.stage, cm.step, cm.epoch, cm.offst = int(head[0]), int64(head[1]), int64(head[2]), int64(head[3])
		keep.mu.Lock()
		spare = keep.peer[1] // the oldest, reused for the next
		keep.mu.Unlock()
		keep.received(cm)
	}
}

func (c *copier) close() {
	if c.cancel != nil {
		c.cancel()
	}
	for _, g := range []*collective.Group{c.out, c.in} {
		if g != nil {
			g.Abort("round over")
			g.Close()
		}
	}
	c.wg.Wait()
	select {
	case cm := <-c.queue: // never sent
		cm.sending.Store(false)
	default:
	}
}

// fromPeers plans, in a generation that keeps no replica of a one-replica
// pipeline, the restore from the commits in members' memory: the newest
// step c at which every stage's state is held by some member (its own
// commit, or the copy its next stage received). The holders send each
// stage's commit to the member placed at that stage, over the round's
// group, stage by stage, into replica 0; it returns the commit this
// member loads (nil when it is not in replica 0), the stages whose state
// came from another member, and whether such a step was found (the same on
// every member; when not, the caller falls back to a checkpoint).
func (w *pipeWorker) fromPeers(ctx context.Context, r *elastic.Round, lay layout.Layout) (*commit, []int, bool, error) {
	n, p := r.Group.Size(), w.cfg.Pipeline.Stages
	mine := w.commits.statement(1, 1)
	all := make([]float64, 6*n)
	if err := r.Group.AllGather(ctx, collective.Float64s(mine), collective.Float64s(all)); err != nil {
		return nil, nil, false, err
	}
	holds := func(rank, stage int, step int64) bool {
		st := all[6*rank : 6*rank+6]
		return (int(st[0]) == stage && (int64(st[1]) == step || int64(st[2]) == step)) ||
			(int(st[3]) == stage && (int64(st[4]) == step || int64(st[5]) == step))
	}
	var steps []int64
	for i := range n {
		for _, j := range []int{1, 2, 4, 5} {
			if all[6*i+j] >= 0 {
				steps = append(steps, int64(all[6*i+j]))
			}
		}
	}
	best := int64(-1)
	for _, c := range steps {
		if c <= best || c > lay.Step {
			continue
		}
		ok := true
		for s := 0; s < p && ok; s++ {
			found := false
			for i := 0; i < n && !found; i++ {
				found = holds(i, s, c)
			}
			ok = found
		}
		if ok {
			best = c
		}
	}
	if best < 0 || len(lay.Ranks) == 0 {
		return nil, nil, false, nil
	}
	var mineToLoad *commit
	var moved []int
	for s := range p {
		target := lay.Ranks[0][s]
		source := -1
		if holds(target, s, best) {
			source = target
		}
		for i := 0; i < n && source < 0; i++ {
			if holds(i, s, best) {
				source = i
			}
		}
		switch {
		case source == target && r.Rank == target:
			mineToLoad = w.commits.find(s, best)
		case source != target && r.Rank == source:
			cm := w.commits.find(s, best)
			head := []float64{float64(len(cm.data)), float64(cm.epoch), float64(cm.offst)}
			if err := r.Group.Send(ctx, target, collective.Float64s(head)); err != nil {
				return nil, nil, false, err
			}
			if err := r.Group.Send(ctx, target, collective.Float32s(cm.data)); err != nil {
				return nil, nil, false, err
			}
		case source != target && r.Rank == target:
			head := make([]float64, 3)
			if err := r.Group.Recv(ctx, source, collective.Float64s(head)); err != nil {
				return nil, nil, false, err
			}
			cm := &commit{stage: s, step: best, epoch: int64(head[1]), offst: int64(head[2]), data: make([]float32, int(head[0]))}
			if err := r.Group.Recv(ctx, source, collective.Float32s(cm.data)); err != nil {
				return nil, nil, false, err
			}
			mineToLoad = cm
		}
		if source != target {
			moved = append(moved, s)
		}
	}
	w.log.Info("restoring from commits in peers' memory", zap.Int64("step", best), zap.Ints("stages_moved", moved))
	return mineToLoad, moved, true, nil
}
