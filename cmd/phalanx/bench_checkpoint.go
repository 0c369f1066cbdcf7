package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
)

// ckptBenchResult is one line of "phalanx bench checkpoint" JSON output.
type ckptBenchResult struct {
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

func benchCheckpoint(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench checkpoint",
		"Measures checkpoint figures against plain minio-go on the same MinIO, in the same run: upload\n"+
			"throughput of a sharded save (--ranks ranks in this process, each storing its share) against one\n"+
			"PutObject of the same bytes; the training stall of an asynchronous checkpoint against one memcpy of\n"+
			"the state; and a restore into every rank (read, verify, gather over the data plane) against one\n"+
			"GetObject. Credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY. Each figure is the median\n"+
			"of --repeat runs. bench/checkpoint.sh starts a MinIO and runs this.", stderr)
	url := fs.String("checkpoint", "", "an s3:// location to measure in (a prefix that may be filled and emptied)")
	sizesText := fs.String("sizes", "64MiB,512MiB", "state sizes")
	ranks := fs.Int("ranks", 4, "ranks saving and restoring")
	repeat := fs.Int("repeat", 3, "runs per figure (the median is reported)")
	jsonOut := fs.Bool("json", false, "print JSON lines instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	sizes, err := parseSizes(*sizesText, 4)
	switch {
	case err != nil:
		return usagef("--sizes: %v", err)
	case *ranks < 1 || *ranks > 64 || *repeat < 1:
		return usagef("--ranks 1..64 and --repeat >= 1")
	}
	loc, err := checkpoint.ParseLocation(*url)
	if err != nil || loc.S3 == nil {
		return usagef("--checkpoint: want an s3:// location (%v)", err)
	}
	store, err := checkpoint.Open(ctx, loc, checkpoint.Credentials{})
	if err != nil {
		return err
	}
	plain, err := minio.New(loc.S3.Endpoint, &minio.Options{Secure: loc.S3.TLS, Region: loc.S3.Region,
		Creds: credentials.NewStaticV4(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), "")})
	if err != nil {
		return err
	}
	var results []ckptBenchResult
	for _, size := range sizes {
		r, err := benchCheckpointSize(ctx, store, plain, loc.S3, size, *ranks, *repeat)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		for _, r := range results {
			enc.Encode(r)
		}
		return nil
	}
	fmt.Fprintf(stdout, "%-8s %5s %9s %9s %7s %9s %9s %7s %9s %9s %7s\n", "state", "ranks", "put_s", "save_s", "up/put",
		"memcpy_s", "stall_s", "st/cpy", "get_s", "restore_s", "rs/get")
	for _, r := range results {
		fmt.Fprintf(stdout, "%-8s %5d %9.3f %9.3f %7.2f %9.4f %9.4f %7.2f %9.3f %9.3f %7.2f\n", humanBytes(int64(r.Bytes)), r.Ranks,
			r.PutS, r.SaveS, r.UploadRatio, r.MemcpyS, r.StallS, r.StallRatio, r.GetS, r.RestoreS, r.ResumeRatio)
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// benchTensors is a state of size bytes in a few tensors, as a model has.
func benchTensors(size int, seed int) []checkpoint.Tensor {
	n := size / 4
	parts := []int{n / 2, n / 4, n / 8, n - n/2 - n/4 - n/8}
	var out []checkpoint.Tensor
	for i, p := range parts {
		d := make([]float32, p)
		for j := range d {
			d[j] = float32((j*31+i+seed)%1000) * 0.001
		}
		out = append(out, checkpoint.Tensor{Name: fmt.Sprintf("t%d", i), Shape: []int64{int64(p)}, Role: "parameter", Data: d})
	}
	return out
}

func benchCheckpointSize(ctx context.Context, store checkpoint.Store, plain *minio.Client, o *checkpoint.S3Options, size, ranks, repeat int) (ckptBenchResult, error) {
	res := ckptBenchResult{Bytes: size, Ranks: ranks}
	key := func(name string) string {
		if o.Prefix == "" {
			return name
		}
		return o.Prefix + "/" + name
	}
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var puts, gets, copies []float64
	for i := range repeat {
		name := key(fmt.Sprintf("bench-plain-%d", i))
		t0 := time.Now()
		if _, err := plain.PutObject(ctx, o.Bucket, name, bytes.NewReader(data), int64(size), minio.PutObjectOptions{}); err != nil {
			return res, fmt.Errorf("plain PutObject: %w", err)
		}
		puts = append(puts, time.Since(t0).Seconds())
		t0 = time.Now()
		obj, err := plain.GetObject(ctx, o.Bucket, name, minio.GetObjectOptions{})
		if err != nil {
			return res, err
		}
		buf := make([]byte, size)
		_, err = io.ReadFull(obj, buf)
		obj.Close()
		if err != nil {
			return res, fmt.Errorf("plain GetObject: %w", err)
		}
		gets = append(gets, time.Since(t0).Seconds())
		plain.RemoveObject(ctx, o.Bucket, name, minio.RemoveObjectOptions{})
		dst := make([]byte, size)
		copy(dst, data) // fault the pages in first
		t0 = time.Now()
		copy(dst, data)
		copies = append(copies, time.Since(t0).Seconds())
	}
	res.PutS, res.GetS, res.MemcpyS = median(puts), median(gets), median(copies)

	groups, err := tcpGroups(ctx, ranks)
	if err != nil {
		return res, err
	}
	defer collective.CloseGroups(groups)
	decided := time.Now().UnixNano() // names the checkpoints: the same on every rank
	cks := make([]*checkpoint.Checkpointer, ranks)
	states := make([][]checkpoint.Tensor, ranks)
	for r := range ranks {
		states[r] = benchTensors(size, 0)
		ck, err := checkpoint.New(checkpoint.Config{Store: store, Job: "bench", Wait: 10 * time.Minute}, states[r])
		if err != nil {
			return res, err
		}
		defer ck.Close(context.Background())
		ck.Bind(checkpoint.Ring{Group: groups[r], Generation: 1, Decided: decided})
		cks[r] = ck
	}
	each := func(f func(r int) error) error {
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		for r := range ranks {
			wg.Add(1)
			go func() { defer wg.Done(); errs[r] = f(r) }()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	var saves, stalls, restores []float64
	step := int64(0)
	for range repeat {
		// A synchronous save (the final-checkpoint path): snapshot, every
		// rank's upload, the vote, the manifest.
		step++
		t0 := time.Now()
		if err := each(func(r int) error {
			_, err := cks[r].AfterStep(ctx, checkpoint.Progress{Step: step}, checkpoint.Votes{}, true)
			return err
		}); err != nil {
			return res, err
		}
		saves = append(saves, time.Since(t0).Seconds())
		// An asynchronous one: what training waits for is AfterStep's return.
		step++
		var mu sync.Mutex
		var stall time.Duration
		if err := each(func(r int) error {
			t := time.Now()
			_, err := cks[r].AfterStep(ctx, checkpoint.Progress{Step: step}, checkpoint.Votes{checkpoint.VoteWant: 1}, false)
			d := time.Since(t)
			mu.Lock()
			stall = max(stall, d)
			mu.Unlock()
			return err
		}); err != nil {
			return res, err
		}
		stalls = append(stalls, stall.Seconds())
		// Settle it: the next step's votes say every rank stored its shard.
		step++
		if err := each(func(r int) error {
			_, err := cks[r].AfterStep(ctx, checkpoint.Progress{Step: step}, checkpoint.Votes{}, true)
			return err
		}); err != nil {
			return res, err
		}
		for r := range ranks {
			clear(states[r][0].Data)
		}
		t0 = time.Now()
		if err := each(func(r int) error {
			_, err := cks[r].Restore(ctx, true)
			return err
		}); err != nil {
			return res, err
		}
		restores = append(restores, time.Since(t0).Seconds())
		if d := states[ranks-1][0].Data; d[len(d)-1] != float32((len(d)-1)*31%1000)*0.001 {
			return res, fmt.Errorf("the restored state differs from the saved one")
		}
	}
	infos, err := checkpoint.List(ctx, store)
	if err != nil {
		return res, err
	}
	for _, in := range infos {
		if err := checkpoint.Remove(ctx, store, in.ID); err != nil {
			return res, err
		}
	}
	res.SaveS, res.StallS, res.RestoreS = median(saves), median(stalls), median(restores)
	res.UploadRatio = res.PutS / res.SaveS
	res.StallRatio = res.StallS / res.MemcpyS
	res.ResumeRatio = res.RestoreS / res.GetS
	return res, nil
}

// tcpGroups joins ranks groups in this process over the TCP data plane on
// loopback, as separate processes would.
func tcpGroups(ctx context.Context, ranks int) ([]*collective.Group, error) {
	peers := make([]string, ranks)
	trs := make([]*collective.TCPTransport, ranks)
	for r := range ranks {
		tr, err := collective.ListenTCP(collective.TCPOptions{Bind: "127.0.0.1:0"})
		if err != nil {
			return nil, err
		}
		trs[r], peers[r] = tr, tr.Addr()
	}
	groups := make([]*collective.Group, ranks)
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			groups[r], errs[r] = collective.Join(ctx, trs[r], collective.Membership{Job: "bench-ckpt", Generation: 1, Rank: r, Peers: peers},
				collective.Options{Timeout: 10 * time.Minute})
		}()
	}
	wg.Wait()
	return groups, errors.Join(errs...)
}
