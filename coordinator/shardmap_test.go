package coordinator

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

func servers(ids ...string) []*phalanxpb.PSServer {
	var out []*phalanxpb.PSServer
	for _, id := range ids {
		out = append(out, &phalanxpb.PSServer{Id: id, Addr: id + ":1"})
	}
	return out
}

func placement(m *phalanxpb.ShardMap) [][]string {
	var out [][]string
	for _, p := range m.Shards {
		out = append(out, append([]string{p.Primary}, p.Backups...))
	}
	return out
}

func TestPlaceAndReassign(t *testing.T) {
	m, err := PlaceShards(4, 1, servers("c", "a", "b"))
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"a", "b"}, {"b", "c"}, {"c", "a"}, {"a", "b"}}
	if got := placement(m); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("placed %v, want %v", got, want)
	}
	if next, err := Reassign(m, map[string]bool{"a": true, "b": true, "c": true}); next != nil || err != nil {
		t.Fatalf("nothing gone: %v %v", next, err)
	}
	next, err := Reassign(m, map[string]bool{"b": true, "c": true}) // a dies
	if err != nil {
		t.Fatal(err)
	}
	want = [][]string{{"b"}, {"b", "c"}, {"c"}, {"b"}}
	if got := placement(next); !slices.EqualFunc(got, want, slices.Equal) || next.Generation != 2 {
		t.Fatalf("after a died: %v (generation %d), want %v", got, next.Generation, want)
	}
	var fo []uint32
	for _, f := range next.Failovers {
		if f.Old != "a" || f.New != "b" {
			t.Errorf("failover %v", f)
		}
		fo = append(fo, f.Shard)
	}
	if !slices.Equal(fo, []uint32{0, 3}) || len(next.Servers) != 2 {
		t.Fatalf("failovers of shards %v, servers %v", fo, next.Servers)
	}
	if _, err := Reassign(next, map[string]bool{"c": true}); !errors.Is(err, ErrShardLost) {
		t.Fatalf("b dies with shard 0's only copy: %v", err)
	}
	for _, bad := range []struct{ shards, replicas, n int }{{0, 0, 1}, {2, 1, 1}, {2, 0, 0}, {2, -1, 2}} {
		var ids []string
		for i := range bad.n {
			ids = append(ids, string(rune('a'+i)))
		}
		if _, err := PlaceShards(bad.shards, bad.replicas, servers(ids...)); err == nil {
			t.Errorf("placed %+v", bad)
		}
	}
}

// TestRunShardMap: the first map waits for the servers; a server whose
// lease is revoked (its process gone) has its shards fail over.
func TestRunShardMap(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli := client(t)
	keys := jobKeys(t, "shardmap")
	maps := make(chan *phalanxpb.ShardMap, 8)
	done := make(chan error, 1)
	go func() {
		done <- NewJob(cli, keys).RunShardMap(ctx, ShardMapConfig{ID: "m", Shards: 2, Replicas: 1, Servers: 2, SessionTTL: testTTL,
			OnMap: func(m *phalanxpb.ShardMap) { maps <- m }})
	}()
	var leases []*Lease
	for _, s := range servers("s0", "s1") {
		l, err := RegisterAt(ctx, cli, keys.PSServer(s.Id), s, testTTL)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	first := recv(t, maps, 30*time.Second, "the first shard map")
	if got := placement(first); !slices.EqualFunc(got, [][]string{{"s0", "s1"}, {"s1", "s0"}}, slices.Equal) {
		t.Fatalf("first map %v", got)
	}
	if err := leases[0].Close(ctx); err != nil { // s0 gone
		t.Fatal(err)
	}
	second := recv(t, maps, 30*time.Second, "the shard map after s0 went")
	if got := placement(second); !slices.EqualFunc(got, [][]string{{"s1"}, {"s1"}}, slices.Equal) || len(second.Failovers) != 1 {
		t.Fatalf("after s0 went: %v, failovers %v", got, second.Failovers)
	}
	m, _, err := NewJob(cli, keys).ReadShardMap(ctx)
	if err != nil || m.Generation != 2 {
		t.Fatalf("stored map %v, %v", m, err)
	}
	if err := leases[1].Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, done, 30*time.Second, "RunShardMap to return once every copy is gone"); !errors.Is(err, ErrShardLost) {
		t.Fatalf("every copy gone: %v", err)
	}
}
