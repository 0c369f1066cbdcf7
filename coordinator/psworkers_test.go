package coordinator

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestPSShareClaims: a share is claimed once; its done mark is refused to
// a lease that does not hold it; when the holder's lease goes the share is
// orphaned and another worker claims it; a done share is claimed no more.
func TestPSShareClaims(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := client(t)
	j := NewJob(cli, jobKeys(t, "psshares"))
	grant := func() clientv3.LeaseID {
		g, err := cli.Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		return g.ID
	}
	a, b := grant(), grant()
	if err := j.ClaimPSShare(ctx, PSShareClaim{Share: 1, Owner: "a"}, a); err != nil {
		t.Fatal(err)
	}
	if err := j.ClaimPSShare(ctx, PSShareClaim{Share: 1, Owner: "a"}, a); err != nil {
		t.Fatalf("a's claim retried (its answer lost): %v, want it taken as a's", err)
	}
	var held *ClaimedError
	if err := j.ClaimPSShare(ctx, PSShareClaim{Share: 1, Owner: "a"}, grant()); !errors.As(err, &held) || held.Holder.Owner != "a" {
		t.Fatalf("a claim by a's name under another lease (a restarted a): %v, want held by a", err)
	}
	if err := j.ClaimPSShare(ctx, PSShareClaim{Share: 1, Owner: "b"}, b); !errors.As(err, &held) || held.Holder.Owner != "a" {
		t.Fatalf("a second claim: %v, want held by a", err)
	}
	if err := j.MarkPSShareDone(ctx, PSShareDone{Share: 1, Owner: "b", Steps: 5}, b); !errors.Is(err, ErrShareLost) {
		t.Fatalf("done by a lease not holding it: %v, want ErrShareLost", err)
	}
	s, _, err := j.ReadPSShares(ctx)
	if err != nil || s.Orphaned(1) || s.Orphaned(0) || s.Claims[1].Owner != "a" {
		t.Fatalf("claims %+v (%v): share 1 held by a, nothing orphaned", s, err)
	}
	if _, err := cli.Revoke(ctx, a); err != nil { // a dies
		t.Fatal(err)
	}
	if s, _, err = j.ReadPSShares(ctx); err != nil || !s.Orphaned(1) {
		t.Fatalf("claims %+v (%v): share 1 orphaned", s, err)
	}
	if err := j.ClaimPSShare(ctx, PSShareClaim{Share: 1, Owner: "b"}, b); err != nil {
		t.Fatal(err)
	}
	if err := j.MarkPSShareDone(ctx, PSShareDone{Share: 1, Owner: "b", Steps: 5}, b); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := j.ClaimPSShare(ctx, PSShareClaim{Share: 1, Owner: "c"}, grant()); !errors.Is(err, ErrShareDone) {
		t.Fatalf("claiming a done share: %v, want ErrShareDone", err)
	}
	if s, _, err = j.ReadPSShares(ctx); err != nil || s.Orphaned(1) || s.Done[1].Steps != 5 {
		t.Fatalf("claims %+v (%v): share 1 done, not orphaned", s, err)
	}
	if err := j.ClearPSShares(ctx); err != nil {
		t.Fatal(err)
	}
	if s, _, err = j.ReadPSShares(ctx); err != nil || len(s.Seen)+len(s.Done)+len(s.Claims) != 0 {
		t.Fatalf("after clearing: %+v (%v)", s, err)
	}
}
