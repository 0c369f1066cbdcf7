package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/status"
)

// TestStatusCommand: phalanx status reads the status a launcher published
// in the job's etcd and prints it as tables, or with --json as the same
// snapshot; a job etcd has never seen is an error naming it.
func TestStatusCommand(t *testing.T) {
	ctx := testContext(t, time.Minute)
	e, err := coordinator.StartEmbedded(ctx, coordinator.EmbeddedOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cli, err := coordinator.Connect(e.Endpoints(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	keys, _ := coordinator.KeysFor("j")
	want := status.Snapshot{Job: "j", Model: "mlp", State: "training", Source: "launcher", Generation: 3, World: 2, Step: 41, Steps: 300,
		Ring: []status.Member{{Rank: 0, ID: "w-a", Pid: 10, Worker: 0}, {Rank: 1, ID: "w-b", Pid: 11, Worker: 1}},
		Workers: []status.Worker{{Index: 0, Pid: 10, Role: "worker", State: "training", Rank: 0, Step: 41}, {Index: 1, Pid: 11, Role: "worker", State: "training", Rank: 1, Step: 41},
			{Index: 2, Pid: 12, Role: "worker", State: "lost", Rank: -1, Step: 30}},
		Generations: []status.Generation{{Number: 3, World: 2, Reason: "lost rank 2", Lost: []int{2}, Step: 30}}}
	b, _ := json.Marshal(want)
	if err := coordinator.NewJob(cli, keys).PublishStatus(ctx, b); err != nil {
		t.Fatal(err)
	}
	ep := strings.Join(e.Endpoints(), ",")

	var out, errOut bytes.Buffer
	if err := runCommand(t, []string{"status", "--etcd-endpoints", ep, "--job", "j", "--json"}, &out, &errOut); err != nil {
		t.Fatalf("status --json: %v\n%s", err, errOut.String())
	}
	var got status.Snapshot
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("status --json printed %q: %v", out.String(), err)
	}
	gb, _ := json.Marshal(got)
	if !bytes.Equal(gb, b) {
		t.Errorf("status --json:\n%s\nwant\n%s", gb, b)
	}

	out.Reset()
	if err := runCommand(t, []string{"status", "--etcd-endpoints", ep, "--job", "j"}, &out, &errOut); err != nil {
		t.Fatalf("status: %v", err)
	}
	for _, line := range []string{"job j (mlp): training · generation 3 · world 2 · step 41/300", "RING", "lost rank 2", "2       12   worker  lost"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("status's tables lack %q:\n%s", line, out.String())
		}
	}

	err = runCommand(t, []string{"status", "--etcd-endpoints", ep, "--job", "nobody"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), `job "nobody"`) || !strings.Contains(err.Error(), "no such job") {
		t.Errorf("status of a job never seen: %v, want an error naming it", err)
	}
}
