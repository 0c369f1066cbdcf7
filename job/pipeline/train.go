package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/job/logical"
	"github.com/phalanx-rt/phalanx/job/pipeline/engine"
	"github.com/phalanx-rt/phalanx/job/pipeline/layout"
	"github.com/phalanx-rt/phalanx/nn"
	"github.com/phalanx-rt/phalanx/worker"
	"go.uber.org/zap"
)

// stepData is a replica's share of one step, cut into micro-batches: the
// engine's Data. Every stage of the replica loads the same share (the
// sampler is deterministic), so the last stage has its labels without
// receiving them.
type stepData struct {
	b        worker.Batch
	idx      []int
	rows     []int // per micro-batch
	offs     []int // per micro-batch: its first row in b
	features int   // per row
	per      int   // rows per sample
	scale    float32
}

func (d *stepData) Rows(micro int) int { return d.rows[micro] }
func (d *stepData) Scale() float32     { return d.scale }

func (d *stepData) Inputs(micro int, x []float32) error {
	o, n := d.offs[micro]*d.features, d.rows[micro]*d.features
	copy(x, d.b.X[o:o+n])
	return nil
}

func (d *stepData) Labels(micro int) []int32 {
	return d.b.Labels[d.offs[micro] : d.offs[micro]+d.rows[micro]]
}

// load fills d with replica's share of the global batch at pos and
// returns the position after it. An epoch's last, short batch is split as
// evenly as the replicas and micro-batches allow.
func (d *stepData) load(s *worker.Sampler, train worker.Dataset, pos worker.Position, global, replicas, replica int) (worker.Position, error) {
	idx, size, next, err := s.Batch(pos, global, replicas, replica, d.idx[:0])
	if err != nil {
		return pos, err
	}
	d.idx = idx
	if err := d.fill(train, idx); err != nil {
		return pos, err
	}
	m := len(d.rows)
	for i := range m {
		lo, hi := collective.ShardRange(len(idx), m, i)
		d.offs[i], d.rows[i] = lo*d.per, (hi-lo)*d.per
	}
	d.scale = 1 / float32(size*d.per) // a sample's loss is its rows' mean
	return next, nil
}

// fill loads samples idx into d.b: per rows of features each, a label a
// row (a split model's samples are its own: no features).
func (d *stepData) fill(data worker.Dataset, idx []int) error {
	d.b.Reset(len(idx), d.features*d.per)
	if err := data.Fill(idx, &d.b); err != nil {
		return fmt.Errorf("pipeline: loading samples: %w", err)
	}
	if d.features == 0 {
		return nil
	}
	if n := len(idx) * d.per; len(d.b.X) != n*d.features || len(d.b.Labels) != n {
		return fmt.Errorf("pipeline: the dataset gave %d values and %d labels for %d samples; a model of %d inputs a row and %d rows a sample takes %d and %d",
			len(d.b.X), len(d.b.Labels), len(idx), d.features, d.per, n*d.features, n)
	}
	return nil
}

// steps runs the job's steps in this round, from the worker's step.
//
// A new generation ends the round between steps, at the same step on every
// stage of a replica: the stage that sees the round's context end votes to
// stop in the step's vote, and the replica applies that step and stops, so
// its stages never disagree on the step they hold. The step's own
// operations run under a context that ends only stopGrace after the
// round's, to free a stage that waits on a peer frozen mid-step.
func (w *pipeWorker) steps(ctx context.Context, rd *roundState) error {
	st := w.stage
	c := &w.cfg
	lastStage := rd.me.Stage == c.Pipeline.Stages-1
	replicas := len(rd.lay.Ranks)
	stepCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() {
		rd.over.Store(true)
		t := time.AfterFunc(stopGrace, func() { cancel(context.Cause(ctx)) })
		context.AfterFunc(stepCtx, func() { t.Stop() })
	})
	defer stop()
	for w.step < c.Steps {
		if rd.norm[3] > 0 { // the replica voted to stop after the last step
			<-ctx.Done() // the new generation, which some stage saw, comes here too
			return fmt.Errorf("%w: %w", errRoundOver, context.Cause(ctx))
		}
		next, err := rd.data.load(w.sampler, w.train, w.pos, c.Batch, replicas, rd.me.Replica)
		if err != nil {
			return err
		}
		s, err := rd.step(stepCtx)
		if err != nil {
			return err
		}
		w.step, w.pos = w.step+1, next
		loss, correct := s.LossSum, float64(s.Correct)
		fp := worker.FingerprintOf(rd.data.idx)
		if rd.stats != nil && rd.fuser != nil {
			// The replicas' loss, right answers and samples, reduced with
			// the gradients.
			loss, correct = float64(rd.stats[0]), float64(rd.stats[1])
			for i := range fp {
				fp[i] = float64(rd.stats[2+i])
			}
		}
		if m := c.Observe; m != nil {
			m.Rank(rd.me.Replica*c.Pipeline.Stages + rd.me.Stage)
			m.Generation(w.gen, replicas*c.Pipeline.Stages)
			l := math.NaN() // only the last stage has a loss
			if lastStage {
				l = loss / float64(rd.data.b.N*rd.data.per)
				if rd.fuser != nil {
					l = loss * float64(rd.data.scale)
				}
			}
			m.Step(rd.me.Stage, w.step, s.Elapsed, c.Batch/max(replicas, 1), l)
		}
		c.Tracer.Flush()
		if rd.me.Replica == 0 || lastStage {
			rep := Step{Step: w.step, Stage: rd.me.Stage, Generation: w.gen, Replicas: replicas,
				BusyS: s.Busy.Seconds(), ElapsedS: s.Elapsed.Seconds(), Bubble: s.Bubble(), Peak: s.Peak,
				WaitS: s.Wait.Seconds(), SendS: s.Send.Seconds(),
				ParamBytes: 4 * paramCount(st.params), SlotBytes: 4 * slotCount(st), ActBytes: rd.activationBytes()}
			if lastStage {
				n := float64(rd.data.b.N * rd.data.per) // rows
				if rd.fuser != nil {
					n = 1 / float64(rd.data.scale)
				}
				rep.Loss, rep.Accuracy, rep.Samples = loss/n, correct/n, int(math.Round(n))/rd.data.per
				rep.GradNorm = rd.norm[0]
				rep.Epoch, rep.Offset, rep.Fingerprint, rep.World = w.pos.Epoch, w.pos.Offset, fp, replicas*c.Pipeline.Stages
				w.last = rep // replayed if this replica is the next generation's replica 0
			}
			if rd.me.Replica == 0 {
				w.rep.Send(rep)
			}
		}
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			return fmt.Errorf("pipeline: step %d's loss is %v", w.step, loss)
		}
		if rd.norm[4] > 0 && w.step < c.Steps {
			return w.stopAt(ctx, rd, loss)
		}
		if rd.saver != nil {
			w.afterVote(ctx, rd, loss)
		}
		if rd.copier != nil && w.step%int64(c.CommitEvery) == 0 {
			rd.copier.offer(w.commits.take(st, w.step, w.pos)) // nil while its slot is still being sent
		}
	}
	return w.finish(ctx, rd)
}

// afterVote acts on the step's checkpoint vote, the same on every stage
// of replica 0: a save every stage has stored gets its index (written by
// stage 0, in the background); one that failed somewhere is given up; and
// when none is in flight and one is due, every stage starts the next.
func (w *pipeWorker) afterVote(ctx context.Context, rd *roundState, loss float64) {
	w.settleVote(ctx, rd, loss)
	sv, every := rd.saver, w.cfg.Checkpoint.EverySteps
	if sv.pending < 0 && every > 0 && w.step%every == 0 && w.step < w.cfg.Steps {
		sv.start(w.step, w.pos.Epoch, w.pos.Offset, w.gen)
	}
}

// settleVote acts on the vote about the save in flight: indexed once
// every stage has stored its part, given up when one failed.
func (w *pipeWorker) settleVote(ctx context.Context, rd *roundState, loss float64) {
	sv, p := rd.saver, float64(w.cfg.Pipeline.Stages)
	stored, failed := rd.norm[1], rd.norm[2]
	if sv.pending >= 0 && (failed > 0 || stored == p) {
		step, pos := sv.pending, sv.pos
		sv.settle()
		switch {
		case failed > 0 && rd.me.Stage == 0:
			w.rep.Send(job.Checkpoint{Step: step, Checkpoint: checkpoint.Event{Kind: "failed", Step: step,
				Err: fmt.Sprintf("%.0f stages could not store their part", failed)}})
		case failed == 0 && rd.me.Stage == 0:
			w.indexing.Add(1)
			go func() {
				defer w.indexing.Done()
				w.index(context.WithoutCancel(ctx), step, pos, w.gen, loss)
			}()
		}
	}
}

// stopAt ends the job at this step boundary, as its operator asked
// (every worker of the job voted so in this step): replica 0's stages
// save the step, the final checkpoint a relaunch resumes from, and no
// worker leaves before they have.
func (w *pipeWorker) stopAt(ctx context.Context, rd *roundState, loss float64) error {
	w.log.Warn("the job is asked to stop: final checkpoint", zap.Int64("step", w.step))
	if rd.saver != nil {
		w.settleVote(ctx, rd, loss)
		if err := w.finalCheckpoint(ctx, rd); err != nil {
			return err
		}
	}
	if rd.me == (layout.Place{}) {
		w.rep.Send(job.Stopped{Step: w.step, Generation: w.gen, World: len(rd.lay.Ranks) * w.cfg.Pipeline.Stages})
	}
	if err := rd.barriers(ctx); err != nil {
		return err
	}
	w.stoppedAt = w.step
	return nil
}

// index writes the index of a checkpoint every stage has stored, and
// reports it saved.
func (w *pipeWorker) index(ctx context.Context, step int64, pos [2]int64, gen uint64, loss float64) string {
	ctx, cancel := context.WithTimeout(ctx, max(w.cfg.Checkpoint.Wait, time.Minute))
	defer cancel()
	t0 := time.Now()
	x, err := indexOf(ctx, w.store, &w.cfg, step, pos, gen)
	name := ""
	if err == nil {
		x.Loss, x.Split = loss, w.splitLayout
		name, err = logical.WriteIndex(ctx, w.store, x)
	}
	ev := checkpoint.Event{Kind: "saved", ID: name, Step: step, URL: w.store.Location(), Seconds: time.Since(t0).Seconds(), WorldAfter: w.cfg.Pipeline.Stages}
	if err != nil {
		ev = checkpoint.Event{Kind: "failed", Step: step, Err: err.Error()}
		w.log.Warn("pipeline checkpoint index", zap.Int64("step", step), zap.Error(err))
	}
	w.rep.Send(job.Checkpoint{Step: step, Checkpoint: ev})
	if err == nil {
		k := w.cfg.Checkpoint
		gone, err := retention{keepLast: k.KeepLast, keepEvery: k.KeepEvery, every: k.EverySteps}.retain(ctx, w.store)
		if err != nil {
			w.log.Warn("pipeline checkpoint retention", zap.Error(err))
		}
		for _, g := range gone {
			w.log.Info("checkpoint deleted by the retention policy", zap.String("index", g))
		}
	}
	return name
}

// finalCheckpoint saves the job's last step, on every stage of replica 0,
// and indexes it once all have: the state a longer run resumes from.
func (w *pipeWorker) finalCheckpoint(ctx context.Context, rd *roundState) error {
	sv := rd.saver
	if sv.pending >= 0 {
		// A periodic save still in flight (every stage of replica 0 has
		// one, or none: their votes start and settle them) is finished
		// as a step's vote would: indexed once every stage stored its
		// part, given up when one failed. Dropped, its parts would stay
		// unindexed, and a relaunch that finds the final checkpoint
		// corrupt would have one fewer to fall back on.
		step, pos := sv.pending, sv.pos
		vote, err := w.finishSave(ctx, rd)
		if err != nil {
			return err
		}
		switch {
		case rd.me.Stage != 0:
		case vote[1] > 0 || vote[0] < float64(w.cfg.Pipeline.Stages):
			w.rep.Send(job.Checkpoint{Step: step, Checkpoint: checkpoint.Event{Kind: "failed", Step: step,
				Err: fmt.Sprintf("%.0f stages could not store their part", vote[1])}})
		default:
			w.indexing.Add(1)
			go func() {
				defer w.indexing.Done()
				w.index(context.WithoutCancel(ctx), step, pos, w.gen, 0)
			}()
		}
	}
	sv.start(w.step, w.pos.Epoch, w.pos.Offset, w.gen)
	vote, err := w.finishSave(ctx, rd)
	if err != nil {
		return err
	}
	if vote[1] > 0 || vote[0] < float64(w.cfg.Pipeline.Stages) {
		return fmt.Errorf("pipeline: the final checkpoint of step %d: %.0f stages could not store their part", w.step, vote[1])
	}
	// The indexes still being written go first: the final one's
	// retention would take their parts, not yet named, for orphans.
	w.indexing.Wait()
	if rd.me.Stage == 0 && w.index(ctx, w.step, [2]int64{w.pos.Epoch, w.pos.Offset}, w.gen, 0) == "" {
		return fmt.Errorf("pipeline: the final checkpoint of step %d could not be indexed", w.step)
	}
	return nil
}

// finishSave waits for the pending save and settles it with the
// replica's stages: the vote summed over them (stored, failed).
func (w *pipeWorker) finishSave(ctx context.Context, rd *roundState) ([]float64, error) {
	sv := rd.saver
	if err := sv.wait(ctx); err != nil {
		return nil, err
	}
	done, failed := sv.vote()
	vote := []float64{done, failed}
	if rd.replica != nil {
		if err := rd.replica.AllReduce(ctx, collective.Float64s(vote), collective.Sum); err != nil {
			return nil, err
		}
	}
	sv.settle()
	return vote, nil
}

func paramCount(ps []*nn.Param) int64 {
	var n int64
	for _, p := range ps {
		n += int64(len(p.Value))
	}
	return n
}

func slotCount(st *stageState) int64 {
	var n int64
	for _, s := range st.opt.Slots() {
		n += int64(len(s.Data))
	}
	return n
}

// activationBytes is what the stage's chunks and engine hold for
// micro-batches in flight.
func (rd *roundState) activationBytes() int64 {
	if rd.eng == nil {
		return 0 // a split model's are its own
	}
	n := rd.eng.BufferBytes()
	for _, c := range rd.eng.Chunks() {
		n += c.Stage.ActivationBytes()
	}
	return n
}

// step runs one training step on the round's engine.
func (rd *roundState) step(ctx context.Context) (engine.Stats, error) {
	if rd.tens != nil {
		return rd.tens.Step(ctx)
	}
	return rd.eng.Step(ctx)
}

// errRoundOver: the replica stopped at a step boundary for a new
// generation. Its groups are closed, not aborted: a peer may still be
// receiving the last vote's message, and an abort would fail that step
// there after it was applied here.
var errRoundOver = errors.New("pipeline: the round is over")

// stopGrace is how long a step goes on after its round's context ended
// before its operations are cancelled.
const stopGrace = time.Second

// finish ends the job in this round: replica 0 measures the model on the
// held-out data through its pipeline, its last stage reports the end, and
// no member leaves before every stage is done with it.
func (w *pipeWorker) finish(ctx context.Context, rd *roundState) error {
	c := &w.cfg
	p := c.Pipeline.Stages
	res := job.Result{Step: w.step, Generation: w.gen, World: len(rd.lay.Ranks) * p}
	if rd.tens != nil && rd.me.Replica == 0 && w.test != nil && w.test.Len() > 0 {
		// Every rank of a split model computes the whole loss.
		loss, correct, err := rd.tens.evaluate(ctx, w.test)
		if err != nil {
			return err
		}
		n := float64(w.test.Len())
		res.Loss, res.Accuracy = loss/n, float64(correct)/n
		if m := w.stage.tensor.measures; m != nil {
			res.Metrics = m(res.Loss, res.Accuracy)
		}
	} else if rd.me.Replica == 0 && w.test != nil && w.test.Len() > 0 {
		per := w.shape.per
		ev := &stepData{features: w.shape.layers[0].In, per: per}
		n := w.test.Len()
		batches := (n + w.shape.rows - 1) / w.shape.rows
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		if err := ev.fill(w.test, all); err != nil {
			return fmt.Errorf("held-out: %w", err)
		}
		ev.rows, ev.offs = make([]int, batches), make([]int, batches)
		for i := range batches {
			ev.offs[i] = i * w.shape.rows * per
			ev.rows[i] = min(w.shape.rows, n-i*w.shape.rows) * per
		}
		loss, correct, err := rd.eng.Infer(ctx, ev, batches)
		if err != nil {
			return err
		}
		// Every stage learns the measures, so that any of them can tell
		// the launcher (a stage may be a process it did not start).
		m := []float64{loss, float64(correct)}
		if rd.replica != nil {
			if err := rd.replica.AllReduce(ctx, collective.Float64s(m), collective.Sum); err != nil {
				return err
			}
		}
		res.Loss, res.Accuracy = m[0]/float64(n*per), m[1]/float64(n*per)
		if w.model.Measures != nil {
			res.Metrics = w.model.Measures(res.Loss, res.Accuracy)
		}
	}
	if rd.saver != nil {
		if err := w.finalCheckpoint(ctx, rd); err != nil {
			return err
		}
	}
	crcs := map[string]uint32{}
	for _, pr := range w.stage.params {
		name := pr.Name
		if w.stage.tensor != nil { // every rank has a part named so
			name = fmt.Sprintf("%s@tp%d", name, rd.me.Stage)
		}
		crcs[name] = paramsCRC([]*nn.Param{pr})
	}
	res.ParametersCRC = paramsCRC(w.stage.params)
	w.rep.Send(StageDone{Replica: rd.me.Replica, Stage: rd.me.Stage, CRCs: crcs})
	if rd.me.Replica == 0 {
		w.rep.Send(Done{Step: w.step, Generation: w.gen, Replicas: len(rd.lay.Ranks), Loss: res.Loss, Accuracy: res.Accuracy, Metrics: res.Metrics})
	}
	if err := rd.barriers(ctx); err != nil {
		return err
	}
	w.result = res
	return nil
}

// barriers returns once every stage of the replica, then every replica
// of the stage, is here: no worker leaves while another still needs it.
func (rd *roundState) barriers(ctx context.Context) error {
	for _, g := range []*collective.Group{rd.replica, rd.dp} {
		if g == nil {
			continue
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
	}
	return nil
}

// paramsCRC is the CRC32C of the parameters, in order, as float32
// little-endian.
func paramsCRC(ps []*nn.Param) uint32 {
	t := crc32.MakeTable(crc32.Castagnoli)
	var crc uint32
	var b [4]byte
	for _, p := range ps {
		for _, v := range p.Value {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			crc = crc32.Update(crc, t, b[:])
		}
	}
	return crc
}
