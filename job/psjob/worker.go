package psjob

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
	"github.com/phalanx-rt/phalanx/ps/cluster"
)

// A parameter-server job's data is cut into shares, one per worker slot
// (PSJob.Workers); share i is what worker i trains in an undisturbed run,
// and the ps client of a share pushes as ps worker i whichever process runs
// it. A worker process registers with a lease, claims its own share under
// it (coordinator.ClaimPSShare) and, once that is done, stays to take over
// shares whose worker died (their claim went with its lease) until every
// share is done. A share taken over resumes at its progress as the shards
// hold it: the last step of the share each shard applied (a push's id is
// its step). Steps some shards applied and others not are trained again;
// the shards that have them answer the push as a duplicate and ignore it,
// so every step of every share is applied exactly once on every shard.

// orphanGrace is how long a share nobody ever claimed waits before the
// other workers take it (its worker died before claiming), in lease TTLs.
const orphanGrace = 10

// errPSLeaseLost ends a worker whose registration's lease was lost: its
// claims are gone and other workers may be training its shares.
var errPSLeaseLost = errors.New("phalanx: this parameter-server worker's lease was lost: its shares go to the others")

// psWorkerProc is one parameter-server worker process.
type psWorkerProc struct {
	cfg   job.Config
	log   *zap.Logger
	coord *coordinator.Job
	job   *phalanxpb.PSJob
	spec  cluster.Spec
	model job.ModelSpec
	dir   *cluster.Directory
	tls   *tls.Config // the job's client side of mutual TLS (nil: plaintext)
	rep   *job.Reporter
	index int
	id    string
	lease clientv3.LeaseID
}

// shareEnd is a share's run's end.
type shareEnd struct {
	share int
	err   error
}

// maxRejoins bounds how often a worker whose lease lapsed registers again.
const maxRejoins = 5

// run claims and trains shares until every share of the job is done. A
// worker whose lease lapsed (a pause, a loaded machine) is out: its claims
// are gone and its shares' runs stopped, since another worker may hold them
// now. It registers again and goes on like any survivor: its own share if
// nobody took it, orphaned ones.
func (w *psWorkerProc) run(ctx context.Context) error {
	for rejoins := 0; ; rejoins++ {
		err := w.session(ctx)
		if !errors.Is(err, errPSLeaseLost) || ctx.Err() != nil || rejoins == maxRejoins {
			return err
		}
		w.log.Warn("the lease lapsed: its shares were stopped; registering again", zap.Int("rejoins", rejoins+1))
	}
}

// session is run under one lease.
func (w *psWorkerProc) session(ctx context.Context) error {
	host, _ := os.Hostname()
	lease, err := w.register(ctx, host)
	if err != nil {
		return err
	}
	w.lease = lease.ID()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer w.release(ctx, lease)
	go func() {
		select {
		case <-lease.Lost():
			cancel(errPSLeaseLost)
		case <-ctx.Done():
		}
	}()
	tables, watched := w.watchShares(ctx)
	s := &shareRuns{w: w, host: host, running: map[int]bool{}, ends: make(chan shareEnd, int(w.job.Workers))}
	defer func() { // no share's goroutine outlives run
		cancel(nil)
		s.wait()
	}()
	if err := s.start(ctx, w.index, "own"); err != nil {
		return leaseCause(ctx, err)
	}
	return s.follow(ctx, tables, watched)
}

// register registers this worker under a new lease, retrying through
// etcd's unavailability.
func (w *psWorkerProc) register(ctx context.Context, host string) (*coordinator.Lease, error) {
	var lease *coordinator.Lease
	err := coordinator.Retry(ctx, job.EtcdRetryBudget, func(err error) {
		w.log.Warn("registering: etcd unavailable; retrying", zap.Error(err))
	}, func(ctx context.Context) (err error) {
		lease, err = coordinator.RegisterAt(ctx, w.coord.Client(), w.coord.Keys().PSWorker(w.id), &phalanxpb.PSServer{Id: w.id, Pid: int64(os.Getpid()), Host: host}, w.cfg.LeaseTTL)
		return err
	})
	return lease, err
}

// release revokes the registration's lease, within a bound even once ctx
// ended.
func (w *psWorkerProc) release(ctx context.Context, lease *coordinator.Lease) {
	rctx, c := context.WithTimeout(context.WithoutCancel(ctx), min(max(w.cfg.LeaseTTL, time.Second), 5*time.Second))
	defer c()
	if err := lease.Close(rctx); err != nil {
		w.log.Warn("revoking the registration's lease: it goes when the lease expires", zap.Error(err))
	}
}

// watchShares follows the shares' claim table until ctx ends: tables holds
// the newest table not yet taken, watched the watch's end.
func (w *psWorkerProc) watchShares(ctx context.Context) (<-chan coordinator.PSShares, <-chan error) {
	tables := make(chan coordinator.PSShares, 1) // the newest table not yet taken
	watched := make(chan error, 1)
	go func() {
		watched <- w.coord.WatchPSShares(ctx, func(s coordinator.PSShares) bool {
			c := coordinator.PSShares{Claims: maps.Clone(s.Claims), Seen: maps.Clone(s.Seen), Done: maps.Clone(s.Done)}
			select { // the only sender: after the drain the send cannot block
			case <-tables:
			default:
			}
			tables <- c
			return true
		})
	}()
	return tables, watched
}

// leaseCause is a session's failure: a failure after the lease lapsed is
// the lapse's.
func leaseCause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return err
}

// shareRuns are a session's runs of shares: those running, and their ends.
type shareRuns struct {
	w       *psWorkerProc
	host    string
	running map[int]bool
	ends    chan shareEnd
}

// start claims share and, if it got it, runs it; a share another worker
// holds or one done already is no error.
func (s *shareRuns) start(ctx context.Context, share int, reason string) error {
	w := s.w
	err := coordinator.Retry(ctx, job.EtcdRetryBudget, func(err error) {
		w.log.Warn("claiming a share: etcd unavailable; retrying", zap.Int("share", share), zap.Error(err))
	}, func(ctx context.Context) error {
		return w.coord.ClaimPSShare(ctx, coordinator.PSShareClaim{Share: share, Owner: w.id, Index: w.index, Pid: os.Getpid(), Host: s.host}, w.lease)
	})
	var held *coordinator.ClaimedError
	switch {
	case errors.As(err, &held), errors.Is(err, coordinator.ErrShareDone):
		return nil
	case err != nil:
		return err
	}
	s.running[share] = true
	w.log.Info("training a share", zap.Int("share", share), zap.String("reason", reason))
	go func() { s.ends <- shareEnd{share, w.runShare(ctx, share, reason)} }()
	return nil
}

// wait waits for the running shares' ends (their context ended).
func (s *shareRuns) wait() {
	for range s.running {
		<-s.ends
	}
}

// follow follows the claim table and the shares' runs until every share
// is done: it marks the shares it finishes done, and takes the orphaned
// ones (and, after the grace, those nobody ever claimed).
func (s *shareRuns) follow(ctx context.Context, tables <-chan coordinator.PSShares, watched <-chan error) error {
	n := int(s.w.job.Workers)
	grace := time.NewTimer(orphanGrace * max(s.w.cfg.LeaseTTL, time.Second))
	defer grace.Stop()
	graceOver := false
	var last coordinator.PSShares
	have := false
	for {
		select {
		case t := <-tables:
			last, have = t, true
		case e := <-s.ends:
			if err := s.ended(ctx, e); err != nil {
				return leaseCause(ctx, err)
			}
		case <-grace.C:
			graceOver = true
		case err := <-watched:
			return leaseCause(ctx, fmt.Errorf("phalanx: following the shares' claims: %w", err))
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		if !have {
			continue
		}
		if len(last.Done) >= n && len(s.running) == 0 {
			return nil
		}
		for _, share := range sharesToTake(last, n, s.running, graceOver) {
			if err := s.start(ctx, share, "adopted"); err != nil {
				return leaseCause(ctx, err)
			}
		}
	}
}

// ended takes a share's run's end: a failure, or the share marked done.
func (s *shareRuns) ended(ctx context.Context, e shareEnd) error {
	w := s.w
	delete(s.running, e.share)
	if e.err != nil {
		return fmt.Errorf("phalanx: share %d: %w", e.share, e.err)
	}
	return coordinator.Retry(ctx, job.EtcdRetryBudget, func(err error) {
		w.log.Warn("marking a share done: etcd unavailable; retrying", zap.Int("share", e.share), zap.Error(err))
	}, func(ctx context.Context) error {
		return w.coord.MarkPSShareDone(ctx, coordinator.PSShareDone{Share: e.share, Owner: w.id, Steps: w.job.Steps}, w.lease)
	})
}

// sharesToTake are the shares of n a worker running those in running
// should try to claim, given the claim table: the orphaned ones (claimed
// once, the claim gone with its worker's lease, not done) and, once the
// grace is over, those nobody ever claimed (a worker that died first).
func sharesToTake(t coordinator.PSShares, n int, running map[int]bool, graceOver bool) []int {
	var out []int
	for share := range n {
		if running[share] {
			continue
		}
		_, claimed := t.Claims[share]
		_, done := t.Done[share]
		if t.Orphaned(share) || (graceOver && !t.Seen[share] && !claimed && !done) {
			out = append(out, share)
		}
	}
	return out
}

// progress is a share's progress as the shards hold it: from, the last
// step every shard of every table applied, and to, the last any applied.
func (w *psWorkerProc) progress(ctx context.Context, cl *ps.Client, share int) (from, to int64, err error) {
	from, to = w.job.Steps, w.job.RestoreStep
	for _, t := range w.job.Tables {
		for s := range w.spec.Shards {
			info, err := cl.Info(ctx, t.Id, s)
			if err != nil {
				return 0, 0, fmt.Errorf("phalanx: shard %d's account of share %d: %w", s, share, err)
			}
			if share >= len(info.LastIDs) {
				return 0, 0, fmt.Errorf("phalanx: shard %d accounts for %d workers, not share %d", s, len(info.LastIDs), share)
			}
			last := int64(info.LastIDs[share])
			from, to = min(from, last), max(to, last)
		}
	}
	return max(from, w.job.RestoreStep), min(to, w.job.Steps), nil
}

// runShare trains share from its progress to the job's last step.
func (w *psWorkerProc) runShare(ctx context.Context, share int, reason string) error {
	rec := w.job
	cl, err := w.shareClient(share)
	if err != nil {
		return err
	}
	defer cl.Close()
	from, replayedTo, err := w.resume(ctx, cl, share)
	if err != nil {
		return err
	}
	w.rep.Send(w.claim(share, reason, from, replayedTo))
	saver, err := w.shareSaver(ctx, cl, share)
	if err != nil {
		return err
	}
	pw := &job.PSWorker{Client: cl, Options: job.Options(rec.Options), Index: share, Workers: int(rec.Workers), Batch: int(rec.Batch), Seed: rec.Seed,
		From: from, Steps: rec.Steps}
	step := w.stepper(share, replayedTo, saver)
	var pushed, pulled int64
	pw.Step = func(ctx context.Context, n int64, epoch int, loss float64, st int) error {
		if m := w.cfg.Observe; m != nil {
			pushes, pulls := cl.Requests()
			m.PSPush(int(pushes - pushed))
			m.PSPull(int(pulls - pulled))
			pushed, pulled = pushes, pulls
			m.Rank(share)
			m.Step(-1, n, 0, int(rec.Batch), loss)
		}
		return step(ctx, n, epoch, loss, st)
	}
	metrics, err := w.model.PS.Run(ctx, pw)
	if err != nil {
		return err
	}
	w.shareDone(share, reason, from, replayedTo, metrics, duplicates(cl, rec))
	return nil
}

// shareClient is a ps client pushing as share's worker.
func (w *psWorkerProc) shareClient(share int) (*ps.Client, error) {
	rec, spec := w.job, w.spec
	return ps.NewClient(ps.ClientConfig{Worker: share, Tables: spec.Tables, Partition: spec.Partition, Shards: spec.Shards,
		Sync: spec.Sync, Directory: w.dir, TLS: w.tls, Logger: w.log.Named("ps-client").With(zap.Int("share", share)), CacheRows: int(rec.CacheRows), CacheStaleness: rec.CacheStaleness})
}

// resume sets the client's clocks to the share's progress as the shards
// hold it: the share resumes after from; steps up to replayedTo some shard
// already applied.
func (w *psWorkerProc) resume(ctx context.Context, cl *ps.Client, share int) (from, replayedTo int64, err error) {
	from, replayedTo, err = w.progress(ctx, cl, share)
	if err != nil {
		return 0, 0, err
	}
	for _, t := range w.job.Tables {
		if err := cl.SetClock(t.Id, from); err != nil {
			return 0, 0, err
		}
	}
	return from, replayedTo, nil
}

// shareSaver takes share 0's checkpoints, if the job has a store (nil
// otherwise).
func (w *psWorkerProc) shareSaver(ctx context.Context, cl *ps.Client, share int) (*cluster.Saver, error) {
	rec := w.job
	if rec.Checkpoint == "" || share != 0 {
		return nil, nil
	}
	store, err := checkpoint.OpenURL(ctx, rec.Checkpoint, w.cfg.Credentials)
	if err != nil {
		return nil, err
	}
	var tables []uint32
	for _, t := range rec.Tables {
		tables = append(tables, t.Id)
	}
	return &cluster.Saver{Store: store, Client: cl, Tables: tables, Spec: w.spec}, nil
}

// stepper is what a share does after each step it trained: share 0
// reports progress every ReportEvery steps (ps_step: the mean loss and the
// examples per second since the last report), waits at the last step for
// the other shares (but under bsp), and saves the checkpoints that are due.
func (w *psWorkerProc) stepper(share int, replayedTo int64, saver *cluster.Saver) func(ctx context.Context, step int64, epoch int, loss float64, st int) error {
	rec, spec := w.job, w.spec
	every := int64(rec.ReportEvery)
	if every <= 0 {
		every = max(1, rec.Steps/20)
	}
	n, b := int(rec.Workers), int(rec.Batch)
	var lossSum float64
	var stale, since int
	now := w.cfg.Now
	if now == nil {
		now = time.Now
	}
	mark := now()
	return func(ctx context.Context, step int64, epoch int, loss float64, st int) error {
		since++
		lossSum += loss
		stale += st
		if share == 0 && (step%every == 0 || step == rec.Steps) {
			secs := now().Sub(mark).Seconds()
			w.rep.Send(Step{Worker: share, Step: step, Steps: rec.Steps, Epoch: int64(epoch), Loss: lossSum / float64(since),
				SamplesPS: float64(since*b*n) / secs, Stale: stale})
			lossSum, stale, since, mark = 0, 0, 0, now()
		}
		if share == 0 && step == rec.Steps && spec.Sync.Mode != ps.BSP {
			// The held-out measures and the last checkpoint are of every
			// share's last step: under asp, ssp and hybrid the others (a
			// share taken over in particular) may still be training.
			if err := w.awaitOtherShares(ctx); err != nil {
				return err
			}
		}
		// A step trained again after a takeover was checkpointed (or not)
		// by the worker that died; the last one is always saved.
		due := (rec.CheckpointEvery > 0 && step%int64(rec.CheckpointEvery) == 0 && step > replayedTo) || step == rec.Steps
		if saver != nil && due {
			m, err := saver.Save(ctx, step, step) // every shard at clock step: exactly step steps under bsp
			if err != nil {
				return err
			}
			w.rep.Send(Checkpoint{Step: step, Steps: rec.Steps, Shards: int(m.Shards)})
		}
		return nil
	}
}

// shareDone reports a share's end: the job's (ps_done, with the held-out
// metrics) from share 0, and the share's own (ps_share_done).
func (w *psWorkerProc) shareDone(share int, reason string, from, replayedTo int64, metrics map[string]float64, dups int64) {
	rec := w.job
	if share == 0 {
		w.rep.Send(Done{Steps: rec.Steps, Metrics: metrics})
	}
	w.rep.Send(ShareDone{Share: w.claim(share, reason, from, replayedTo), Duplicates: dups})
}

// claim is this worker's claim of share (ps_share): why, and where it
// resumes.
func (w *psWorkerProc) claim(share int, reason string, from, replayedTo int64) Share {
	return Share{Worker: w.index, Pid: os.Getpid(), Share: share, Steps: w.job.Steps, Reason: reason, From: from, ReplayedTo: replayedTo}
}

// duplicates are the pushes the shards answered as applied already.
func duplicates(cl *ps.Client, rec *phalanxpb.PSJob) int64 {
	var dups int64
	for _, t := range rec.Tables {
		dups += cl.Duplicates(t.Id)
	}
	return dups
}

// awaitOtherShares waits until every share but 0 is done.
func (w *psWorkerProc) awaitOtherShares(ctx context.Context) error {
	n := int(w.job.Workers)
	all := false
	err := w.coord.WatchPSShares(ctx, func(s coordinator.PSShares) bool {
		for share := 1; share < n; share++ {
			if _, ok := s.Done[share]; !ok {
				return true
			}
		}
		all = true
		return false
	})
	if err == nil && !all {
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("phalanx: waiting for the other shares' last steps: %w", err)
	}
	return nil
}

// psAccounts asks every shard of every table for its account of the
// pushes (after the workers are done): the evidence that no acknowledged
// push was lost or applied twice.
func psAccounts(ctx context.Context, coord *coordinator.Job, job *phalanxpb.PSJob, tlsCfg *tls.Config, log *zap.Logger) ([]psShardAccount, error) {
	spec, err := cluster.SpecOf(job)
	if err != nil {
		return nil, err
	}
	dir, err := cluster.NewDirectory(ctx, coord)
	if err != nil {
		return nil, err
	}
	cl, err := ps.NewClient(ps.ClientConfig{Worker: 0, Tables: spec.Tables, Partition: spec.Partition, Shards: spec.Shards,
		Sync: spec.Sync, Directory: dir, TLS: tlsCfg, Logger: log})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var out []psShardAccount
	for _, t := range job.Tables {
		for s := range spec.Shards {
			info, err := cl.Info(ctx, t.Id, s)
			if err != nil {
				return nil, fmt.Errorf("phalanx: shard %d's account of table %d: %w", s, t.Id, err)
			}
			out = append(out, psShardAccount{Table: t.Id, Shard: s, Info: info})
		}
	}
	return out, nil
}

// psShardAccount is one shard's account of one table.
type psShardAccount struct {
	Table uint32
	Shard int
	Info  ps.ShardInfo
}

// exactlyOnce reports whether a shard's account shows every step of every
// share from its base to steps applied once: true only where every step
// pushes every shard (not asp, where a step pushes only the shards its keys
// fall on). The count alone is not enough: a step lost beside one applied
// twice leaves it even.
func (a psShardAccount) exactlyOnce(mode ps.Mode, steps int64) bool {
	if mode == ps.ASP {
		return false
	}
	for _, p := range a.Info.Pushes {
		if int64(p.Last) != steps || int64(p.Applied) != steps-p.Base || p.Again != 0 || p.Skipped != 0 {
			return false
		}
	}
	return true
}
