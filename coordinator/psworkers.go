package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A parameter-server job's data is cut into shares, one per worker slot;
// a worker process claims a share under its lease and trains it. When the
// process dies its lease expires, the claim goes with it, and a surviving
// worker claims the share and goes on from the share's progress (which the
// parameter servers hold: the last step of the share each shard applied).
// A share's done mark outlives every lease.

// PSWorkers is the prefix of parameter-server workers' registrations.
func (k Keys) PSWorkers() string { return k.prefix + "ps/workers/" }

// PSWorker is parameter-server worker id's registration, whose lease holds
// its claims.
func (k Keys) PSWorker(id string) string { return k.PSWorkers() + id }

// PSShares is the prefix of the data shares' claims, claim marks and done
// marks.
func (k Keys) PSShares() string { return k.prefix + "ps/shares/" }

// PSShareClaim is share's claim (a PSShareClaim under its owner's lease).
func (k Keys) PSShareClaim(share int) string { return fmt.Sprintf("%sclaim/%05d", k.PSShares(), share) }

// PSShareSeen marks that share was claimed once (no lease): its claim gone
// and not done, the share is orphaned.
func (k Keys) PSShareSeen(share int) string { return fmt.Sprintf("%sseen/%05d", k.PSShares(), share) }

// PSShareDone marks share trained to the job's last step (a PSShareDone).
func (k Keys) PSShareDone(share int) string { return fmt.Sprintf("%sdone/%05d", k.PSShares(), share) }

// PSShareClaim is who trains a share.
type PSShareClaim struct {
	Share int    `json:"share"`
	Owner string `json:"owner"` // the worker's id
	Index int    `json:"index"` // the worker's launch index
	Pid   int    `json:"pid"`
	Host  string `json:"host,omitempty"`
}

// PSShareDone is a share's done mark.
type PSShareDone struct {
	Share int    `json:"share"`
	Owner string `json:"owner"`
	Steps int64  `json:"steps"`
}

// PSShares is the claim table: claims held now, shares ever claimed, and
// shares done.
type PSShares struct {
	Claims map[int]PSShareClaim
	Seen   map[int]bool
	Done   map[int]PSShareDone
}

// Orphaned reports whether share was claimed once, is claimed no longer
// and is not done: its worker is gone.
func (s PSShares) Orphaned(share int) bool {
	_, claimed := s.Claims[share]
	_, done := s.Done[share]
	return s.Seen[share] && !claimed && !done
}

// ErrShareDone: the share is trained already.
var ErrShareDone = errors.New("coordinator: the share is done")

// ErrShareLost: the share's claim is not (or no longer) held under the
// caller's lease; another worker may be training it.
var ErrShareLost = errors.New("coordinator: the share's claim is not held under this lease")

// ClaimedError is ClaimPSShare's error when another worker holds the share.
type ClaimedError struct{ Holder PSShareClaim }

func (e *ClaimedError) Error() string {
	return fmt.Sprintf("coordinator: share %d is claimed by %s (pid %d)", e.Holder.Share, e.Holder.Owner, e.Holder.Pid)
}

// ClaimPSShare claims c.Share under lease if nobody holds it and it is not
// done; it fails with a *ClaimedError or ErrShareDone otherwise. A claim
// already held by c.Owner under lease is this claim, retried after its
// answer was lost: it succeeds.
func (j *Job) ClaimPSShare(ctx context.Context, c PSShareClaim, lease clientv3.LeaseID) error {
	val, err := json.Marshal(c)
	if err != nil {
		return err
	}
	claim, done := j.keys.PSShareClaim(c.Share), j.keys.PSShareDone(c.Share)
	tx, err := j.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(claim), "=", 0), clientv3.Compare(clientv3.CreateRevision(done), "=", 0)).
		Then(clientv3.OpPut(claim, string(val), clientv3.WithLease(lease)), clientv3.OpPut(j.keys.PSShareSeen(c.Share), c.Owner)).
		Else(clientv3.OpGet(claim), clientv3.OpGet(done)).Commit()
	if err != nil {
		return fmt.Errorf("coordinator: claiming share %d: %w", c.Share, err)
	}
	if tx.Succeeded {
		return nil
	}
	if len(tx.Responses[1].GetResponseRange().Kvs) > 0 {
		return fmt.Errorf("claiming share %d: %w", c.Share, ErrShareDone)
	}
	var h PSShareClaim
	if kvs := tx.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if err := json.Unmarshal(kvs[0].Value, &h); err != nil {
			return fmt.Errorf("coordinator: %s is not a share's claim: %w", claim, err)
		}
		if h.Owner == c.Owner && clientv3.LeaseID(kvs[0].Lease) == lease {
			return nil
		}
	}
	h.Share = c.Share
	return &ClaimedError{Holder: h}
}

// MarkPSShareDone records d.Share done, if its claim is held under lease
// (ErrShareLost otherwise); the claim stays until the lease goes.
func (j *Job) MarkPSShareDone(ctx context.Context, d PSShareDone, lease clientv3.LeaseID) error {
	val, err := json.Marshal(d)
	if err != nil {
		return err
	}
	claim := j.keys.PSShareClaim(d.Share)
	tx, err := j.cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(claim), "=", lease), clientv3.Compare(clientv3.CreateRevision(claim), ">", 0)).
		Then(clientv3.OpPut(j.keys.PSShareDone(d.Share), string(val))).Commit()
	if err != nil {
		return fmt.Errorf("coordinator: marking share %d done: %w", d.Share, err)
	}
	if !tx.Succeeded {
		return fmt.Errorf("marking share %d done: %w", d.Share, ErrShareLost)
	}
	return nil
}

// ReadPSShares reads the claim table and the revision it was read at.
func (j *Job) ReadPSShares(ctx context.Context) (PSShares, int64, error) {
	s := PSShares{Claims: map[int]PSShareClaim{}, Seen: map[int]bool{}, Done: map[int]PSShareDone{}}
	resp, err := j.cli.Get(ctx, j.keys.PSShares(), clientv3.WithPrefix())
	if err != nil {
		return s, 0, fmt.Errorf("coordinator: reading the shares' claims: %w", err)
	}
	for _, kv := range resp.Kvs {
		if err := s.apply(j.keys, string(kv.Key), kv.Value, false); err != nil {
			return s, 0, err
		}
	}
	return s, resp.Header.Revision, nil
}

// apply records one key's value (or its deletion).
func (s PSShares) apply(keys Keys, key string, val []byte, deleted bool) error {
	rest := strings.TrimPrefix(key, keys.PSShares())
	kind, num, ok := strings.Cut(rest, "/")
	share, err := strconv.Atoi(num)
	if !ok || err != nil {
		return nil // not a share's key
	}
	switch kind {
	case "claim":
		if deleted {
			delete(s.Claims, share)
			return nil
		}
		var c PSShareClaim
		if err := json.Unmarshal(val, &c); err != nil {
			return fmt.Errorf("coordinator: %s is not a share's claim: %w", key, err)
		}
		s.Claims[share] = c
	case "seen":
		if deleted {
			delete(s.Seen, share)
		} else {
			s.Seen[share] = true
		}
	case "done":
		if deleted {
			delete(s.Done, share)
			return nil
		}
		var d PSShareDone
		if err := json.Unmarshal(val, &d); err != nil {
			return fmt.Errorf("coordinator: %s is not a share's done mark: %w", key, err)
		}
		s.Done[share] = d
	}
	return nil
}

// WatchPSShares calls f with the claim table now and after every change,
// until f returns false, ctx ends or the watch fails. f must not keep the
// table: it is changed in place.
func (j *Job) WatchPSShares(ctx context.Context, f func(PSShares) bool) error {
	s, rev, err := j.ReadPSShares(ctx)
	if err != nil {
		return err
	}
	if !f(s) {
		return nil
	}
	wch, stop := watchAfterRead(ctx, j.cli, rev, j.keys.PSShares(), clientv3.WithPrefix())
	defer stop()
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("coordinator: watching the shares' claims: %w", err)
		}
		for _, ev := range resp.Events {
			if err := s.apply(j.keys, string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete); err != nil {
				return err
			}
		}
		if !f(s) {
			return nil
		}
	}
	return ctx.Err()
}

// ClearPSShares removes a previous run's claims and marks (a launch does,
// before its workers start).
func (j *Job) ClearPSShares(ctx context.Context) error {
	if _, err := j.cli.Delete(ctx, j.keys.PSShares(), clientv3.WithPrefix()); err != nil {
		return fmt.Errorf("coordinator: clearing the shares' claims: %w", err)
	}
	return nil
}
