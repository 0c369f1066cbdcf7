package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/phalanx-rt/phalanx/internal/bytesize"
	"io"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
)

// CheckpointConfig is what the checkpoint benchmark measures.
type CheckpointConfig struct {
	// S3 is where: a bucket and prefix that may be filled and emptied. Plain
	// minio-go uses its AccessKey and SecretKey; the checkpoint store, when
	// they are empty, the environment (see checkpoint.S3Options).
	S3     checkpoint.S3Options
	Sizes  []int // state sizes in bytes, whole float32s
	Ranks  int   // ranks saving and restoring, in this process over loopback TCP
	Repeat int   // runs per figure; the median is reported
}

// CheckpointResult is one state size's figures; its JSON form is one line of
// `phalanx bench checkpoint --json`.
type CheckpointResult struct {
	Bytes       int     `json:"bytes"`
	Ranks       int     `json:"ranks"`
	PutS        float64 `json:"plain_put_s"`   // plain minio-go PutObject of the same bytes
	SaveS       float64 `json:"save_s"`        // our sharded save, snapshot to manifest
	UploadRatio float64 `json:"upload_ratio"`  // our throughput / plain PutObject's
	MemcpyS     float64 `json:"memcpy_s"`      // copying the state once
	StallS      float64 `json:"stall_s"`       // what training waits for at an asynchronous checkpoint
	StallRatio  float64 `json:"stall_memcpy"`  // stall / memcpy
	GetS        float64 `json:"plain_get_s"`   // plain minio-go GetObject of the same bytes
	RestoreS    float64 `json:"restore_s"`     // our restore into every rank
	ResumeRatio float64 `json:"restore_ratio"` // restore / plain GetObject
}

// minStateBytes gives each of benchTensors' four tensors an element.
const minStateBytes = 32

func (c CheckpointConfig) validate() error {
	switch {
	case c.S3.Bucket == "" || c.S3.Endpoint == "":
		return errors.New("bench: checkpoint: no bucket or endpoint")
	case len(c.Sizes) == 0:
		return errors.New("bench: checkpoint: no sizes")
	case c.Ranks < 1 || c.Repeat < 1:
		return fmt.Errorf("bench: checkpoint: %d ranks and %d repeats, want at least 1 of each", c.Ranks, c.Repeat)
	}
	for _, s := range c.Sizes {
		if s < minStateBytes || s%4 != 0 {
			return fmt.Errorf("bench: checkpoint: size %d, want whole float32s and at least %d bytes", s, minStateBytes)
		}
	}
	return nil
}

// Checkpoint measures, for every state size, a sharded save, the stall of an
// asynchronous checkpoint and a restore into every rank (read, verify, gather
// over the data plane) against plain minio-go PutObject, a memcpy and
// GetObject of the same bytes on the same service, in the same run.
func Checkpoint(ctx context.Context, cfg CheckpointConfig) ([]CheckpointResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := checkpoint.NewS3Store(ctx, cfg.S3)
	if err != nil {
		return nil, err
	}
	o := cfg.S3
	plain, err := minio.New(o.Endpoint, &minio.Options{Secure: o.TLS, Region: o.Region,
		Creds: credentials.NewStaticV4(o.AccessKey, o.SecretKey, o.SessionToken)})
	if err != nil {
		return nil, fmt.Errorf("bench: checkpoint: minio-go for %s: %w", o.Endpoint, err)
	}
	var results []CheckpointResult
	for _, size := range cfg.Sizes {
		r := CheckpointResult{Bytes: size, Ranks: cfg.Ranks}
		if err := measurePlain(ctx, plain, o, size, cfg.Repeat, &r); err != nil {
			return results, fmt.Errorf("bench: checkpoint: %d bytes: %w", size, err)
		}
		if err := measureCheckpointer(ctx, store, size, cfg.Ranks, cfg.Repeat, &r); err != nil {
			return results, fmt.Errorf("bench: checkpoint: %d bytes: %w", size, err)
		}
		r.UploadRatio = r.PutS / r.SaveS
		r.StallRatio = r.StallS / r.MemcpyS
		r.ResumeRatio = r.RestoreS / r.GetS
		results = append(results, r)
	}
	return results, nil
}

// WriteCheckpoint runs Checkpoint and prints its figures as
// `phalanx bench checkpoint` does.
func WriteCheckpoint(ctx context.Context, cfg CheckpointConfig, out Output) error {
	results, err := Checkpoint(ctx, cfg)
	if err != nil {
		return err
	}
	if out.JSON {
		enc := json.NewEncoder(out.W)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintf(out.W, "%-8s %5s %9s %9s %7s %9s %9s %7s %9s %9s %7s\n", "state", "ranks", "put_s", "save_s", "up/put",
		"memcpy_s", "stall_s", "st/cpy", "get_s", "restore_s", "rs/get")
	for _, r := range results {
		fmt.Fprintf(out.W, "%-8s %5d %9.3f %9.3f %7.2f %9.4f %9.4f %7.2f %9.3f %9.3f %7.2f\n", bytesize.Format(int64(r.Bytes)), r.Ranks,
			r.PutS, r.SaveS, r.UploadRatio, r.MemcpyS, r.StallS, r.StallRatio, r.GetS, r.RestoreS, r.ResumeRatio)
	}
	return nil
}

// measurePlain fills in the references: plain PutObject and GetObject of
// size bytes, and one memcpy of them.
func measurePlain(ctx context.Context, plain *minio.Client, o checkpoint.S3Options, size, repeat int, res *CheckpointResult) error {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	buf, dst := make([]byte, size), make([]byte, size)
	var puts, gets, copies []float64
	for i := range repeat {
		name := fmt.Sprintf("bench-plain-%d", i)
		if o.Prefix != "" {
			name = o.Prefix + "/" + name
		}
		t0 := time.Now()
		if _, err := plain.PutObject(ctx, o.Bucket, name, bytes.NewReader(data), int64(size), minio.PutObjectOptions{}); err != nil {
			return fmt.Errorf("plain PutObject %s: %w", name, err)
		}
		puts = append(puts, time.Since(t0).Seconds())
		t0 = time.Now()
		obj, err := plain.GetObject(ctx, o.Bucket, name, minio.GetObjectOptions{})
		if err != nil {
			return fmt.Errorf("plain GetObject %s: %w", name, err)
		}
		_, err = io.ReadFull(obj, buf)
		obj.Close()
		if err != nil {
			return fmt.Errorf("plain GetObject %s: %w", name, err)
		}
		gets = append(gets, time.Since(t0).Seconds())
		if err := plain.RemoveObject(ctx, o.Bucket, name, minio.RemoveObjectOptions{}); err != nil {
			return fmt.Errorf("plain RemoveObject %s: %w", name, err)
		}
		copy(dst, data) // fault the pages in first
		t0 = time.Now()
		copy(dst, data)
		copies = append(copies, time.Since(t0).Seconds())
	}
	res.PutS, res.GetS, res.MemcpyS = median(puts), median(gets), median(copies)
	return nil
}

// measureCheckpointer fills in our figures: save, stall and restore of a
// size-byte state by ranks Checkpointers, and removes what they wrote.
func measureCheckpointer(ctx context.Context, store checkpoint.Store, size, ranks, repeat int, res *CheckpointResult) error {
	groups, closeGroups, err := loopbackGroups(ctx, ranks, "bench-ckpt", collective.Options{Timeout: 10 * time.Minute})
	if err != nil {
		return err
	}
	defer closeGroups()
	decided := time.Now().UnixNano() // names the checkpoints: the same on every rank
	cks := make([]*checkpoint.Checkpointer, ranks)
	states := make([][]checkpoint.Tensor, ranks)
	for r := range ranks {
		states[r] = benchTensors(size)
		ck, err := checkpoint.New(checkpoint.Config{Store: store, Job: "bench", Wait: 10 * time.Minute}, states[r])
		if err != nil {
			return err
		}
		defer ck.Close(context.Background())
		ck.Bind(checkpoint.Ring{Group: groups[r], Generation: 1, Decided: decided})
		cks[r] = ck
	}
	afterStep := func(step int64, votes checkpoint.Votes, last bool) func(r int) error {
		return func(r int) error {
			_, err := cks[r].AfterStep(ctx, checkpoint.Progress{Step: step}, votes, last)
			return err
		}
	}
	var saves, stalls, restores []float64
	step := int64(0)
	for range repeat {
		// A synchronous save (the final-checkpoint path): snapshot, every
		// rank's upload, the vote, the manifest.
		step++
		t0 := time.Now()
		if err := onEveryRank(ranks, afterStep(step, checkpoint.Votes{}, true)); err != nil {
			return err
		}
		saves = append(saves, time.Since(t0).Seconds())
		// An asynchronous one: what training waits for is AfterStep's return.
		step++
		var mu sync.Mutex
		var stall time.Duration
		async := afterStep(step, checkpoint.Votes{checkpoint.VoteWant: 1}, false)
		if err := onEveryRank(ranks, func(r int) error {
			t := time.Now()
			err := async(r)
			d := time.Since(t)
			mu.Lock()
			stall = max(stall, d)
			mu.Unlock()
			return err
		}); err != nil {
			return err
		}
		stalls = append(stalls, stall.Seconds())
		// Settle it: the next step's votes say every rank stored its shard.
		step++
		if err := onEveryRank(ranks, afterStep(step, checkpoint.Votes{}, true)); err != nil {
			return err
		}
		for r := range ranks {
			clear(states[r][0].Data)
		}
		t0 = time.Now()
		if err := onEveryRank(ranks, func(r int) error {
			_, err := cks[r].Restore(ctx, true)
			return err
		}); err != nil {
			return err
		}
		restores = append(restores, time.Since(t0).Seconds())
		if d := states[ranks-1][0].Data; d[len(d)-1] != float32((len(d)-1)*31%1000)*0.001 {
			return errors.New("the restored state differs from the saved one")
		}
	}
	infos, err := checkpoint.List(ctx, store)
	if err != nil {
		return err
	}
	for _, in := range infos {
		if err := checkpoint.Remove(ctx, store, in.ID); err != nil {
			return err
		}
	}
	res.SaveS, res.StallS, res.RestoreS = median(saves), median(stalls), median(restores)
	return nil
}

// benchTensors is a state of size bytes in a few tensors, as a model has.
func benchTensors(size int) []checkpoint.Tensor {
	n := size / 4
	parts := []int{n / 2, n / 4, n / 8, n - n/2 - n/4 - n/8}
	var out []checkpoint.Tensor
	for i, p := range parts {
		d := make([]float32, p)
		for j := range d {
			d[j] = float32((j*31+i)%1000) * 0.001
		}
		out = append(out, checkpoint.Tensor{Name: fmt.Sprintf("t%d", i), Shape: []int64{int64(p)}, Role: "parameter", Data: d})
	}
	return out
}

// onEveryRank runs f for ranks 0..n-1 at once, as the ranks of a job would.
func onEveryRank(n int, f func(r int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = f(r) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// loopbackGroups joins n ranks in this process over the TCP data plane on
// loopback, as separate processes would: the TCP counterpart of
// collective.InprocGroups. closeAll closes the groups, then their listeners.
func loopbackGroups(ctx context.Context, n int, job string, opts collective.Options) (groups []*collective.Group, closeAll func(), err error) {
	trs := make([]*collective.TCPTransport, 0, n)
	closeAll = func() {
		collective.CloseGroups(groups)
		for _, tr := range trs {
			tr.Close()
		}
	}
	peers := make([]string, n)
	for r := range n {
		tr, err := collective.ListenTCP(collective.TCPOptions{Bind: "127.0.0.1:0", Logger: opts.Logger})
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		trs, peers[r] = append(trs, tr), tr.Addr()
	}
	ts := make([]collective.Transport, n)
	for r, tr := range trs {
		ts[r] = tr
	}
	if groups, err = collective.JoinAll(ctx, ts, collective.Membership{Job: job, Generation: 1, Peers: peers}, opts); err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("joining %d ranks over loopback TCP: %w", n, err)
	}
	return groups, closeAll, nil
}
