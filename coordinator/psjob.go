package coordinator

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// WritePSJob records a parameter-server job's configuration for its servers
// and workers; a job already recorded must be the same.
func WritePSJob(ctx context.Context, cli *clientv3.Client, keys Keys, j *phalanxpb.PSJob) error {
	val, err := proto.Marshal(j)
	if err != nil {
		return err
	}
	tx, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keys.PSJob()), "=", 0)).
		Then(clientv3.OpPut(keys.PSJob(), string(val))).Else(clientv3.OpGet(keys.PSJob())).Commit()
	if err != nil {
		return fmt.Errorf("coordinator: recording the parameter-server job: %w", err)
	}
	if !tx.Succeeded {
		var old phalanxpb.PSJob
		kvs := tx.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 || proto.Unmarshal(kvs[0].Value, &old) != nil || !proto.Equal(&old, j) {
			return fmt.Errorf("coordinator: %s holds another job's configuration: use another --job", keys.PSJob())
		}
	}
	return nil
}

// ReadPSJob waits until the job's configuration is recorded and returns it.
// It only decodes the record: cluster.ReadJob checks it as well.
func ReadPSJob(ctx context.Context, cli *clientv3.Client, keys Keys) (*phalanxpb.PSJob, error) {
	for {
		resp, err := cli.Get(ctx, keys.PSJob())
		if err != nil {
			return nil, fmt.Errorf("coordinator: reading the parameter-server job: %w", err)
		}
		if len(resp.Kvs) == 1 {
			// Every job has tables, so it never encodes to nothing.
			if len(resp.Kvs[0].Value) == 0 {
				return nil, fmt.Errorf("coordinator: %s is not a parameter-server job: the value is empty", keys.PSJob())
			}
			var j phalanxpb.PSJob
			if err := proto.Unmarshal(resp.Kvs[0].Value, &j); err != nil {
				return nil, fmt.Errorf("coordinator: %s is not a parameter-server job: %w", keys.PSJob(), err)
			}
			return &j, nil
		}
		if err := awaitPut(ctx, cli, keys.PSJob(), resp.Header.Revision); err != nil {
			return nil, err
		}
	}
}
