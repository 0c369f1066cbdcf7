package coordinator

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// The records of hybrid mode's stragglers: exclusions (the step leader asks
// the coordinator to keep a worker out), the ring's pace (what an excluded
// worker measures itself against) and feed requests (an excluded worker
// asks rank 0 for the ring's parameters).

// Exclude asks the coordinator to keep straggler x.Id out of the ring from
// the next generation on (never below the minimum number of workers).
func (j *Job) Exclude(ctx context.Context, x *phalanxpb.Exclusion) error {
	return putProto(ctx, j.cli, j.keys.Exclusion(x.Id), x, "excluding "+x.Id)
}

// Readmit lifts the exclusion of worker id: it enters the ring again after
// the join window.
func (j *Job) Readmit(ctx context.Context, id string) error {
	if err := idempotent(ctx, func(ctx context.Context) error {
		_, err := j.cli.Delete(ctx, j.keys.Exclusion(id))
		return err
	}); err != nil {
		return fmt.Errorf("coordinator: readmitting %s: %w", id, err)
	}
	return nil
}

// WaitExcluded returns worker id's exclusion record once there is one (at
// once when it is excluded already).
func (j *Job) WaitExcluded(ctx context.Context, id string) (*phalanxpb.Exclusion, error) {
	key := j.keys.Exclusion(id)
	for {
		resp, err := j.cli.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("coordinator: reading %s: %w", key, err)
		}
		if len(resp.Kvs) == 1 {
			var x phalanxpb.Exclusion
			if err := proto.Unmarshal(resp.Kvs[0].Value, &x); err != nil {
				return nil, fmt.Errorf("coordinator: %s is not an exclusion record: %w", key, err)
			}
			if x.DeadlineNanos <= 0 {
				return nil, fmt.Errorf("coordinator: %s: an exclusion without a deadline", key)
			}
			return &x, nil
		}
		if err := awaitPut(ctx, j.cli, key, resp.Header.Revision); err != nil {
			return nil, err
		}
	}
}

// WritePace records the ring's progress and pace (rank 0, now and then).
func (j *Job) WritePace(ctx context.Context, p *phalanxpb.Pace) error {
	return putProto(ctx, j.cli, j.keys.Progress(), p, "recording the ring's pace")
}

// ReadPace reads the ring's latest pace; nil before rank 0 wrote one.
func (j *Job) ReadPace(ctx context.Context) (*phalanxpb.Pace, error) {
	resp, err := j.cli.Get(ctx, j.keys.Progress())
	if err != nil {
		return nil, fmt.Errorf("coordinator: reading the ring's pace: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var p phalanxpb.Pace
	if err := proto.Unmarshal(resp.Kvs[0].Value, &p); err != nil || p.Step < 0 {
		return nil, fmt.Errorf("coordinator: %s is not a pace record (%v)", j.keys.Progress(), err)
	}
	return &p, nil
}

// RequestFeed records an excluded worker's request for the ring's
// parameters (its latest request replaces the earlier one).
func (j *Job) RequestFeed(ctx context.Context, r *phalanxpb.FeedRequest) error {
	return putProto(ctx, j.cli, j.keys.Feed(r.Id), r, "requesting parameters for "+r.Id)
}

// FeedServed removes worker id's answered feed request.
func (j *Job) FeedServed(ctx context.Context, id string) error {
	if err := idempotent(ctx, func(ctx context.Context) error {
		_, err := j.cli.Delete(ctx, j.keys.Feed(id))
		return err
	}); err != nil {
		return fmt.Errorf("coordinator: removing the feed request of %s: %w", id, err)
	}
	return nil
}

// WatchFeeds calls f with every feed request written from now on, until
// ctx ends; unreadable requests are skipped.
func (j *Job) WatchFeeds(ctx context.Context, f func(*phalanxpb.FeedRequest)) {
	for wr := range j.cli.Watch(ctx, j.keys.Feeds(), clientv3.WithPrefix()) {
		for _, e := range wr.Events {
			if e.Type != clientv3.EventTypePut {
				continue
			}
			var r phalanxpb.FeedRequest
			if err := proto.Unmarshal(e.Kv.Value, &r); err != nil || r.Id == "" {
				continue
			}
			f(&r)
		}
	}
}

// putProto writes one record, through transient etcd errors; what names
// it in the error.
func putProto(ctx context.Context, cli *clientv3.Client, key string, m proto.Message, what string) error {
	val, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	if err := idempotent(ctx, func(ctx context.Context) error {
		_, err := cli.Put(ctx, key, string(val))
		return err
	}); err != nil {
		return fmt.Errorf("coordinator: %s: %w", what, err)
	}
	return nil
}
