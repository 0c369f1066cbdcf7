package coordinator

import (
	"errors"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// TestWatchAfterRead: a watch set up after a read sees the change made
// between the two and every later one, not the one the read saw; stop
// closes it; a read whose revision was compacted since gets one
// ErrCompacted answer, and the watch closes.
func TestWatchAfterRead(t *testing.T) {
	cli := client(t)
	ctx := testwait.Context(t, time.Minute)
	key := jobKeys(t, "watch").Prefix() + "k"
	if _, err := cli.Put(ctx, key, "read"); err != nil {
		t.Fatal(err)
	}
	read, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, key, "between"); err != nil {
		t.Fatal(err)
	}
	wch, stop := watchAfterRead(ctx, cli, read.Header.Revision, key)
	defer stop()
	if _, err := cli.Put(ctx, key, "after"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		wr := testwait.Recv(t, wch, 10*time.Second, "the changes after the read")
		if err := wr.Err(); err != nil {
			t.Fatalf("watch failed: %v", err)
		}
		for _, ev := range wr.Events {
			got = append(got, string(ev.Kv.Value))
		}
	}
	if !slices.Equal(got, []string{"between", "after"}) {
		t.Fatalf("watch saw %q, want the changes after the read: [between after]", got)
	}
	stop()
	closed(t, wch, "the watch to close on stop")

	last, err := cli.Put(ctx, key, "compacted away")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, last.Header.Revision); err != nil {
		t.Fatal(err)
	}
	wch, stop = watchAfterRead(ctx, cli, read.Header.Revision, key)
	defer stop()
	wr := testwait.Recv(t, wch, 10*time.Second, "the compacted watch's answer")
	if !errors.Is(wr.Err(), rpctypes.ErrCompacted) {
		t.Fatalf("a watch from a compacted revision answered %v (%d events), want %v", wr.Err(), len(wr.Events), rpctypes.ErrCompacted)
	}
	closed(t, wch, "the compacted watch to close")
}

// closed waits, up to 10s, for wch to close, dropping what comes first.
func closed(t *testing.T, wch clientv3.WatchChan, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		for range wch {
		}
		close(done)
	}()
	testwait.Recv(t, done, 10*time.Second, what)
}
