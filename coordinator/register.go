package coordinator

import (
	"context"
	"fmt"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// Lease is a worker's registration, kept alive until Close or until etcd
// stops renewing it.
type Lease struct {
	cli    *clientv3.Client
	id     clientv3.LeaseID
	key    string
	lost   chan struct{}
	cancel context.CancelFunc
}

// ttlSeconds rounds a TTL up to etcd's whole seconds.
func ttlSeconds(ttl time.Duration) int64 { return max(1, int64(math.Ceil(ttl.Seconds()))) }

// Register writes reg under j.Keys().Worker(reg.Id) with a lease of ttl and keeps
// the lease alive in the background.
func (j *Job) Register(ctx context.Context, reg *phalanxpb.Registration, ttl time.Duration) (*Lease, error) {
	if reg.Id == "" {
		return nil, fmt.Errorf("coordinator: registration without an id")
	}
	return RegisterAt(ctx, j.cli, j.keys.Worker(reg.Id), reg, ttl)
}

// RegisterAt writes rec under key with a lease of ttl and keeps the lease
// alive in the background: the key goes when the process does.
func RegisterAt(ctx context.Context, cli *clientv3.Client, key string, rec proto.Message, ttl time.Duration) (*Lease, error) {
	val, err := proto.Marshal(rec)
	if err != nil {
		return nil, err
	}
	grant, err := cli.Grant(ctx, ttlSeconds(ttl))
	if err != nil {
		return nil, fmt.Errorf("coordinator: lease for %s: %w", key, err)
	}
	if _, err := cli.Put(ctx, key, string(val), clientv3.WithLease(grant.ID)); err != nil {
		cli.Revoke(context.WithoutCancel(ctx), grant.ID)
		return nil, fmt.Errorf("coordinator: registering %s: %w", key, err)
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ch, err := cli.KeepAlive(kctx, grant.ID)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("coordinator: keeping %s alive: %w", key, err)
	}
	l := &Lease{cli: cli, id: grant.ID, key: key, lost: make(chan struct{}), cancel: cancel}
	go func() {
		for range ch { // drained; closed when the lease can no longer be renewed
		}
		close(l.lost)
	}()
	return l, nil
}

// Lost is closed when the lease is no longer renewed (expired, revoked, or
// etcd unreachable past the TTL).
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// ID is the etcd lease.
func (l *Lease) ID() clientv3.LeaseID { return l.id }

// Close revokes the lease, removing the registration at once.
func (l *Lease) Close(ctx context.Context) error {
	l.cancel()
	_, err := l.cli.Revoke(ctx, l.id)
	return err
}

// decodeRegistration parses a registration value, naming the key when it is
// not one.
func decodeRegistration(key string, val []byte) (*phalanxpb.Registration, error) {
	var r phalanxpb.Registration
	if err := proto.Unmarshal(val, &r); err != nil {
		return nil, fmt.Errorf("coordinator: %s is not a registration: %w", key, err)
	}
	if r.Id == "" {
		return nil, fmt.Errorf("coordinator: %s: registration without an id", key)
	}
	return &r, nil
}

// DecodeGeneration parses a generation record.
func DecodeGeneration(key string, val []byte) (*phalanxpb.Generation, error) {
	var g phalanxpb.Generation
	if err := proto.Unmarshal(val, &g); err != nil {
		return nil, fmt.Errorf("coordinator: %s is not a generation record: %w", key, err)
	}
	return &g, nil
}
