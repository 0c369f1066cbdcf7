package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/logical"
	"github.com/phalanx-rt/phalanx/tp"
)

// A pipeline checkpoint is every stage's own checkpoint of one step (each
// stage of replica 0 writes its state, parameters and optimizer slots, as
// a checkpoint of package checkpoint under the prefix pipeline/p<P>-s<s>/),
// tied together by an index written last, once every stage's is stored
// (logical.Index): it names each stage's checkpoint, every tensor and the
// stage holding it, the sampler position, the state's hash, and how a
// split model's tensors are cut. A job resumes from the newest index whose
// stage checkpoints all verify, or from a ring's checkpoint of the same
// model when that is newer, into any number of replicas and stages, or
// tensor-parallel ranks: each new stage reads its tensors, or its slices
// of them, by name, wherever they were (package logical).

// stateHash identifies what gives a pipeline's state its meaning
// (logical.StateHash).
func stateHash(c *job.Config) string {
	return logical.StateHash(c.Model, c.ModelOptions, c.Optimizer.Kind, c.Seed)
}

// stageTensors are a stage's state as named tensors: its parameters, then
// its optimizer's slots.
func stageTensors(st *stageState) []checkpoint.Tensor {
	var ts []checkpoint.Tensor
	for _, p := range st.params {
		ts = append(ts, checkpoint.Tensor{Name: p.Name, Role: "parameter", Shape: shape64(p.Shape), Data: p.Value})
	}
	for _, s := range st.opt.Slots() {
		ts = append(ts, checkpoint.Tensor{Name: s.Name, Role: "optimizer", Shape: shape64(s.Shape), Data: s.Data})
	}
	return ts
}

func shape64(s []int) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[i] = int64(v)
	}
	return out
}

// saver writes a stage's checkpoints in the background: a snapshot of the
// state taken at a step boundary, stored by a goroutine while training
// goes on.
type saver struct {
	store   checkpoint.Store // the job's
	prefix  string
	ck      *checkpoint.Checkpointer
	live    []checkpoint.Tensor
	snap    []checkpoint.Tensor
	pending int64         // the step being saved; -1: none
	wait0   time.Duration // bounds one save (Checkpoint.Wait)
	pos     [2]int64
	done    chan saved // the pending save's result
	result  *saved     // received, not yet voted on
}

type saved struct {
	step int64
	err  error
}

func newSaver(store checkpoint.Store, c *job.Config, stages, stage int, st *stageState, log *zap.Logger) (*saver, error) {
	s := &saver{store: store, prefix: fmt.Sprintf("pipeline/p%d-s%d/", stages, stage), live: stageTensors(st), pending: -1,
		done: make(chan saved, 1), wait0: max(c.Checkpoint.Wait, time.Minute)}
	for _, t := range s.live {
		c := t
		c.Data = make([]float32, len(t.Data))
		s.snap = append(s.snap, c)
	}
	ck, err := checkpoint.New(checkpoint.Config{Store: checkpoint.Prefixed(store, s.prefix), Job: c.Job, StateHash: stateHash(c),
		Model: c.Model, ModelOptions: c.ModelOptions, Seed: c.Seed, Wait: s.wait0, Logger: log, Now: c.Now}, s.snap) // the bound of the goroutine that saves
	if err != nil {
		return nil, err
	}
	s.ck = ck
	return s, nil
}

// start snapshots the state after step and stores it in the background.
func (s *saver) start(step int64, epoch, offset int64, gen uint64) {
	for i, t := range s.live {
		copy(s.snap[i].Data, t.Data)
	}
	s.pending, s.pos = step, [2]int64{epoch, offset}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.wait0)
		defer cancel()
		_, err := s.ck.SaveAlone(ctx, checkpoint.Progress{Step: step, Epoch: epoch, Offset: offset}, gen)
		s.done <- saved{step: step, err: err}
	}()
}

// vote is this stage's part of the step's vote: whether the pending save
// (if any) has been stored, and whether it failed.
func (s *saver) vote() (done, failed float64) {
	if s.pending < 0 {
		return 1, 0
	}
	for s.result == nil {
		select {
		case r := <-s.done:
			if r.step == s.pending { // not an abandoned save's
				s.result = &r
			}
		default:
			return 0, 0
		}
	}
	if s.result.err != nil {
		return 0, 1
	}
	return 1, 0
}

// wait blocks until the pending save has been stored (or failed).
func (s *saver) wait(ctx context.Context) error {
	for s.pending >= 0 && s.result == nil {
		select {
		case r := <-s.done:
			if r.step == s.pending {
				s.result = &r
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
}

// settle ends the pending save once the stages have voted on it (a save
// still running is abandoned: its result is ignored when it comes).
func (s *saver) settle() int64 {
	step := s.pending
	s.pending, s.result = -1, nil
	return step
}

// newestSource is the checkpoint a job of c resumes from: the newest
// index of store whose parts verify, or the newest ring checkpoint of the
// same model when it is of a later step (a data-parallel run's, resumed
// split or staged); nil when there is neither. Checkpoints that do not
// verify are skipped, said through skip.
func newestSource(ctx context.Context, store checkpoint.Store, c *job.Config, skip func(name string, err error)) (*logical.Source, error) {
	return logical.Newest(ctx, store, stateHash(c), &logical.Model{Name: c.Model, Options: c.ModelOptions, Seed: c.Seed}, skip)
}

// restoreStage loads stage st's tensors, by name, from src: each whole
// for a pipeline stage, each rank's slice for a split model's.
func restoreStage(ctx context.Context, src *logical.Source, st *stageState) error {
	ts, shapes, slices, err := logicalState(st)
	if err != nil {
		return err
	}
	return src.Load(ctx, ts, shapes, slices)
}

// logicalState is a stage's tensors (stageTensors) with their logical
// shapes and, for a split model's rank, the slice each one is.
func logicalState(st *stageState) ([]checkpoint.Tensor, [][]int, []tp.Slice, error) {
	ts := stageTensors(st)
	if st.tensor == nil {
		return ts, logical.Shapes(ts), nil, nil
	}
	shapes := make([][]int, len(ts))
	mine := map[string]tp.Slice{}
	for _, s := range st.tensor.slices {
		mine[s.Local.Name] = s
	}
	slices := make([]tp.Slice, len(ts))
	for i, t := range ts {
		param, _, _ := strings.Cut(t.Name, "/") // an optimizer slot is cut as its parameter
		s, ok := mine[param]
		if !ok {
			return nil, nil, nil, fmt.Errorf("pipeline: tensor %s of no parameter of the model", t.Name)
		}
		slices[i], shapes[i] = s, s.Shape
	}
	return ts, shapes, slices, nil
}

// resumable refuses, before anything starts, a launch whose workers would
// refuse to resume: --resume with no checkpoint that verifies, or a newest
// checkpoint (an index, or a newer ring checkpoint) of another model,
// shape or optimizer. state builds the state to check it against.
func resumable(ctx context.Context, c *job.Config, store checkpoint.Store, state func() (*stageState, error)) error {
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	src, err := newestSource(lctx, store, c, func(string, error) {}) // the workers say what they skip
	switch {
	case err != nil:
		return err
	case src == nil && c.Checkpoint.Resume:
		return fmt.Errorf("checkpoint: no checkpoint in %s verifies: %w", store.Location(), checkpoint.ErrNoCheckpoint)
	case src == nil:
		return nil
	}
	st, err := state()
	if err != nil {
		return err
	}
	ts, shapes, _, err := logicalState(st)
	if err != nil {
		return err
	}
	return src.Check(ts, shapes)
}

// indexOf builds the index of the checkpoint of step saved in generation
// gen by every stage: each stage's is found under its prefix by its name.
func indexOf(ctx context.Context, store checkpoint.Store, c *job.Config, step int64, pos [2]int64, gen uint64) (*logical.Index, error) {
	p := c.Pipeline.Stages
	x := &logical.Index{Format: 1, Step: step, Epoch: pos[0], Offset: pos[1], Generation: gen, StateHash: stateHash(c), Stages: p, Cuts: c.Pipeline.Cuts}
	want := partPrefix(step, gen)
	for s := range p {
		prefix := fmt.Sprintf("pipeline/p%d-s%d/", p, s)
		ps := checkpoint.Prefixed(store, prefix)
		infos, err := checkpoint.List(ctx, ps)
		if err != nil {
			return nil, err
		}
		var id string
		for _, in := range infos {
			if in.Complete && strings.HasPrefix(in.ID, want) {
				id = in.ID
				break
			}
		}
		if id == "" {
			return nil, fmt.Errorf("pipeline checkpoint of step %d: stage %d's part is not in %s", step, s, ps.Location())
		}
		m, err := checkpoint.ReadManifest(ctx, ps, id)
		if err != nil {
			return nil, err
		}
		pt := logical.Part{Stage: s, Prefix: prefix, ID: id}
		for _, t := range m.Tensors {
			pt.Tensors = append(pt.Tensors, t.Name)
		}
		x.Parts = append(x.Parts, pt)
	}
	return x, nil
}

// VerifyCheckpoints verifies every pipeline checkpoint in store: each
// index's own checksum, and every stage's part it names, wholly. It says
// how many indexes verified, and what did not.
func (Kind) VerifyCheckpoints(ctx context.Context, store checkpoint.Store) (int, error) {
	names, err := logical.IndexNames(ctx, store)
	if err != nil {
		return 0, err
	}
	n := 0
	var bad []string
	for _, name := range names {
		if _, err := logical.OpenIndex(ctx, store, name); err != nil {
			bad = append(bad, err.Error())
			continue
		}
		n++
	}
	if len(bad) > 0 {
		return n, fmt.Errorf("%d pipeline checkpoints do not verify: %s", len(bad), strings.Join(bad, "; "))
	}
	return n, nil
}

// finalIndex is the name of the index of the final checkpoint of a job
// stopped at step: the newest that verifies, which must be of that step.
func finalIndex(ctx context.Context, store checkpoint.Store, c *job.Config, step int64) (string, error) {
	if store == nil {
		return "", errors.New("the job has no checkpoint store")
	}
	var bad []string
	src, err := logical.NewestIndex(ctx, store, stateHash(c), func(name string, err error) { bad = append(bad, err.Error()) })
	var x *logical.Index
	if src != nil {
		x = src.Index
	}
	refused := ""
	if len(bad) > 0 {
		refused = " (refused: " + strings.Join(bad, "; ") + ")"
	}
	switch {
	case err != nil:
		return "", err
	case x == nil:
		return "", fmt.Errorf("no pipeline checkpoint in %s verifies: launched again, the job starts afresh%s", store.Location(), refused)
	case x.Step != step:
		return "", fmt.Errorf("no pipeline checkpoint of step %d in %s; the newest is of step %d (%s): launched again, the job resumes there and trains steps %d..%d again%s",
			step, store.Location(), x.Step, x.Name(), x.Step+1, step, refused)
	}
	return x.Name(), nil
}

// partPrefix begins the IDs of the stage parts of step saved in
// generation gen (package checkpoint's names).
func partPrefix(step int64, gen uint64) string { return fmt.Sprintf("step-%012d-g%d-", step, gen) }

// splitLayouts are the layouts of a split model's parameters that are
// cut (tp.Slices).
func splitLayouts(ss []tp.Slice) map[string]logical.Layout {
	out := map[string]logical.Layout{}
	for _, s := range ss {
		if s.Split() {
			out[s.Local.Name] = logical.Layout{Shape: s.Shape, Axis: s.Axis, Blocks: s.Blocks}
		}
	}
	return out
}
