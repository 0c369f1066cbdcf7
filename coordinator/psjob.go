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
func (j *Job) WritePSJob(ctx context.Context, rec *phalanxpb.PSJob) error {
	val, err := proto.Marshal(rec)
	if err != nil {
		return err
	}
	tx, err := j.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(j.keys.PSJob()), "=", 0)).
		Then(clientv3.OpPut(j.keys.PSJob(), string(val))).Else(clientv3.OpGet(j.keys.PSJob())).Commit()
	if err != nil {
		return fmt.Errorf("coordinator: recording the parameter-server job: %w", err)
	}
	if !tx.Succeeded {
		var old phalanxpb.PSJob
		kvs := tx.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 || proto.Unmarshal(kvs[0].Value, &old) != nil || !proto.Equal(&old, rec) {
			return fmt.Errorf("coordinator: %s holds another job's configuration: use another --job", j.keys.PSJob())
		}
	}
	return nil
}

// ReadPSJob waits until the job's configuration is recorded and returns it.
// It only decodes the record: cluster.ReadJob checks it as well.
func (j *Job) ReadPSJob(ctx context.Context) (*phalanxpb.PSJob, error) {
	for {
		resp, err := j.cli.Get(ctx, j.keys.PSJob())
		if err != nil {
			return nil, fmt.Errorf("coordinator: reading the parameter-server job: %w", err)
		}
		if len(resp.Kvs) == 1 {
			// Every job has tables, so it never encodes to nothing.
			if len(resp.Kvs[0].Value) == 0 {
				return nil, fmt.Errorf("coordinator: %s is not a parameter-server job: the value is empty", j.keys.PSJob())
			}
			var rec phalanxpb.PSJob
			if err := proto.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
				return nil, fmt.Errorf("coordinator: %s is not a parameter-server job: %w", j.keys.PSJob(), err)
			}
			return &rec, nil
		}
		if err := awaitPut(ctx, j.cli, j.keys.PSJob(), resp.Header.Revision); err != nil {
			return nil, err
		}
	}
}
