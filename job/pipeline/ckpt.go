package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/tp"
)

// A pipeline checkpoint is every stage's own checkpoint of one step (each
// stage of replica 0 writes its state, parameters and optimizer slots, as
// a checkpoint of package checkpoint under the prefix pipeline/p<P>-s<s>/),
// tied together by an index written last, once every stage's is stored:
// pipeline/index-step-<step>-g<gen>-<time>.json names each stage's
// checkpoint, every tensor and the stage holding it,
// the sampler position and the state's hash. A job resumes from the newest
// index whose stage checkpoints all verify, into any number of replicas and
// stages: each new stage reads its tensors by name, wherever they were.
type index struct {
	Format     int     `json:"format"`
	Step       int64   `json:"step"`
	Epoch      int64   `json:"epoch"`
	Offset     int64   `json:"offset"`
	Generation uint64  `json:"generation"`
	StateHash  string  `json:"state_hash"`
	Stages     int     `json:"stages"`
	Cuts       []int   `json:"cuts"`
	Parts      []part  `json:"parts"`
	Loss       float64 `json:"loss"`
	// Split: a split model's parameters by name, how each is cut across
	// the Stages tensor-parallel ranks that wrote the parts (their
	// optimizer slots, named param/kind, are cut alike); a parameter
	// absent is whole in every part. A restore into another number of
	// ranks rebuilds each logical tensor from the parts' slices.
	Split map[string]splitLayout `json:"split,omitempty"`
	CRC   uint32                 `json:"crc32c"` // of the JSON with this field 0
	name  string                 // its object's name, when read
}

// splitLayout is how a logical tensor is cut (tp.Slice without the
// ranges, which BlockRanges gives for each rank).
type splitLayout struct {
	Shape  []int `json:"shape"`
	Axis   int   `json:"axis"`
	Blocks int   `json:"blocks"`
}

// part is one stage's checkpoint in an index.
type part struct {
	Stage   int      `json:"stage"`
	Prefix  string   `json:"prefix"`
	ID      string   `json:"id"` // its manifest checks itself
	Tensors []string `json:"tensors"`
}

const indexPrefix = "pipeline/index-"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (x *index) encode() ([]byte, error) {
	x.CRC = 0
	b, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	x.CRC = crc32.Checksum(b, castagnoli)
	return json.Marshal(x)
}

func decodeIndex(name string, b []byte) (*index, error) {
	var x index
	if err := json.Unmarshal(b, &x); err != nil {
		return nil, fmt.Errorf("pipeline checkpoint %s: %w", name, err)
	}
	want := x.CRC
	x.CRC = 0
	plain, _ := json.Marshal(&x)
	if got := crc32.Checksum(plain, castagnoli); got != want || x.Format != 1 {
		return nil, fmt.Errorf("pipeline checkpoint %s: checksum %08x, want %08x (format %d): corrupt", name, got, want, x.Format)
	}
	x.CRC, x.name = want, name
	return &x, nil
}

// stateHash identifies what gives a pipeline's state its meaning: the
// model and its options, the optimizer's kind and the seed (not the cuts,
// replicas or schedule: a checkpoint resumes under others).
func stateHash(c *job.Config) string {
	b, _ := json.Marshal(struct {
		Model     string
		Options   map[string]string
		Optimizer string
		Seed      uint64
	}{c.Model, c.ModelOptions, c.Optimizer.Kind, c.Seed})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:6])
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

// writeIndex stores the index of a checkpoint whose every stage's part
// is stored.
func writeIndex(ctx context.Context, store checkpoint.Store, x *index) (string, error) {
	b, err := x.encode()
	if err != nil {
		return "", err
	}
	// The generation is padded so that names sort by it at one step (a
	// step trained again after a rollback is indexed again).
	name := fmt.Sprintf("%sstep-%012d-g%012d-%x.json", indexPrefix, x.Step, x.Generation, uint64(time.Now().UnixNano()))
	return name, store.Put(ctx, name, b)
}

// newestIndex is the newest index of the store whose stage checkpoints
// all verify and whose state is this job's, with the manifests of its
// parts; nil when there is none. Indexes that do not verify are skipped
// (said through skip).
func newestIndex(ctx context.Context, store checkpoint.Store, hash string, skip func(name string, err error)) (*index, []*manifestOf, error) {
	objs, err := store.List(ctx, indexPrefix)
	if err != nil {
		return nil, nil, fmt.Errorf("pipeline checkpoints: %w", err)
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		if !strings.Contains(strings.TrimPrefix(o.Name, indexPrefix), "/") {
			names = append(names, o.Name)
		}
	}
	slices.Sort(names)
	for i := len(names) - 1; i >= 0; i-- {
		x, ms, err := openIndex(ctx, store, names[i])
		if err == nil && x.StateHash != hash {
			return nil, nil, fmt.Errorf("pipeline checkpoint %s holds another model's state (state %s, this job's %s): give this job another --checkpoint location",
				names[i], x.StateHash, hash)
		}
		if err != nil {
			skip(names[i], err)
			continue
		}
		return x, ms, nil
	}
	return nil, nil, nil
}

// manifestOf is a part's verified manifest and its store.
type manifestOf struct {
	store checkpoint.Store
	m     *phalanxpb.Manifest
}

// openIndex reads index name and verifies every part's checkpoint.
func openIndex(ctx context.Context, store checkpoint.Store, name string) (*index, []*manifestOf, error) {
	var size int64 = -1
	objs, err := store.List(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	for _, o := range objs {
		if o.Name == name {
			size = o.Size
		}
	}
	if size < 0 || size > 64<<20 {
		return nil, nil, fmt.Errorf("pipeline checkpoint %s: missing or %d bytes", name, size)
	}
	b := make([]byte, size)
	if err := store.ReadAt(ctx, name, b, 0); err != nil {
		return nil, nil, err
	}
	x, err := decodeIndex(name, b)
	if err != nil {
		return nil, nil, err
	}
	var ms []*manifestOf
	for _, p := range x.Parts {
		ps := checkpoint.Prefixed(store, p.Prefix)
		m, err := checkpoint.ReadManifest(ctx, ps, p.ID)
		if err != nil {
			return nil, nil, err
		}
		if err := checkpoint.Verify(ctx, ps, m); err != nil {
			return nil, nil, err
		}
		ms = append(ms, &manifestOf{store: ps, m: m})
	}
	return x, ms, nil
}

// restoreStage loads stage st's tensors, by name, from the parts of x.
func restoreStage(ctx context.Context, x *index, ms []*manifestOf, st *stageState) error {
	if st.tensor != nil {
		return restoreSplit(ctx, x, ms, st)
	}
	where := map[string]int{}
	for i, p := range x.Parts {
		for _, n := range p.Tensors {
			where[n] = i
		}
	}
	for _, t := range stageTensors(st) {
		i, ok := where[t.Name]
		if !ok {
			return fmt.Errorf("pipeline checkpoint of step %d has no tensor %q", x.Step, t.Name)
		}
		if err := checkpoint.ReadTensor(ctx, ms[i].store, ms[i].m, t.Name, t.Data); err != nil {
			return err
		}
	}
	return nil
}

// indexOf builds the index of the checkpoint of step saved in generation
// gen by every stage: each stage's is found under its prefix by its name.
func indexOf(ctx context.Context, store checkpoint.Store, c *job.Config, step int64, pos [2]int64, gen uint64) (*index, error) {
	p := c.Pipeline.Stages
	x := &index{Format: 1, Step: step, Epoch: pos[0], Offset: pos[1], Generation: gen, StateHash: stateHash(c), Stages: p, Cuts: c.Pipeline.Cuts}
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
		pt := part{Stage: s, Prefix: prefix, ID: id}
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
	objs, err := store.List(ctx, indexPrefix)
	if err != nil {
		return 0, err
	}
	n := 0
	var bad []string
	for _, o := range objs {
		if strings.Contains(strings.TrimPrefix(o.Name, indexPrefix), "/") {
			continue // not an index
		}
		if _, _, err := openIndex(ctx, store, o.Name); err != nil {
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
	x, _, err := newestIndex(ctx, store, stateHash(c), func(name string, err error) { bad = append(bad, err.Error()) })
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
			step, store.Location(), x.Step, x.name, x.Step+1, step, refused)
	}
	return x.name, nil
}

// partPrefix begins the IDs of the stage parts of step saved in
// generation gen (package checkpoint's names).
func partPrefix(step int64, gen uint64) string { return fmt.Sprintf("step-%012d-g%d-", step, gen) }

// restoreSplit loads a split model's rank from the parts of x, written by
// x.Stages ranks: with as many ranks as this job's, each reads its own
// part; otherwise each logical tensor is rebuilt from every part's slice
// of it (x.Split says how they are cut) and this rank takes its own.
func restoreSplit(ctx context.Context, x *index, ms []*manifestOf, st *stageState) error {
	ts := st.tensor
	T := ts.comm.Size()
	if len(ms) != x.Stages {
		return fmt.Errorf("pipeline checkpoint of step %d names %d parts for %d ranks", x.Step, len(ms), x.Stages)
	}
	if x.Stages == T {
		for _, t := range stageTensors(st) {
			if err := checkpoint.ReadTensor(ctx, ms[st.stage].store, ms[st.stage].m, t.Name, t.Data); err != nil {
				return err
			}
		}
		return nil
	}
	if x.Split == nil {
		return fmt.Errorf("pipeline checkpoint of step %d was written by %d ranks a replica and says nothing of how its tensors are cut: it restores only into %d", x.Step, x.Stages, x.Stages)
	}
	mine := map[string]tp.Slice{}
	for _, s := range ts.slices {
		mine[s.Local.Name] = s
	}
	var logical, src []float32
	for _, t := range stageTensors(st) {
		param, _, _ := strings.Cut(t.Name, "/") // an optimizer slot is cut as its parameter
		s, ok := mine[param]
		if !ok {
			return fmt.Errorf("pipeline: tensor %s of no parameter of the model", t.Name)
		}
		lay, split := x.Split[param]
		if split != s.Split() || (split && (!slices.Equal(lay.Shape, s.Shape) || lay.Axis != s.Axis || lay.Blocks != s.Blocks)) {
			return &checkpoint.IncompatibleError{ID: x.name, Reason: fmt.Sprintf("tensor %s is cut %+v there, %v × %d blocks along axis %d here", t.Name, lay, s.Shape, s.Blocks, s.Axis)}
		}
		if !split { // whole in every part
			if err := checkpoint.ReadTensor(ctx, ms[0].store, ms[0].m, t.Name, t.Data); err != nil {
				return err
			}
			continue
		}
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		logical = growF32(logical, n)
		for q := range x.Stages {
			old := s.At(x.Stages, q)
			if !overlaps(old.Ranges, s.Ranges) {
				continue // none of this rank's values: not read
			}
			src = growF32(src, old.Len())
			if err := checkpoint.ReadTensor(ctx, ms[q].store, ms[q].m, t.Name, src); err != nil {
				return err
			}
			old.Put(src, logical)
		}
		s.Take(logical, t.Data)
	}
	return nil
}

// overlaps reports whether any range of a meets any of b.
func overlaps(a, b [][2]int) bool {
	for _, x := range a {
		for _, y := range b {
			if x[0] < y[1] && y[0] < x[1] {
				return true
			}
		}
	}
	return false
}

func growF32(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// splitLayouts are the layouts of a split model's parameters that are
// cut (tp.Slices).
func splitLayouts(ss []tp.Slice) map[string]splitLayout {
	out := map[string]splitLayout{}
	for _, s := range ss {
		if s.Split() {
			out[s.Local.Name] = splitLayout{Shape: s.Shape, Axis: s.Axis, Blocks: s.Blocks}
		}
	}
	return out
}
