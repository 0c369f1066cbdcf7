package ps

import (
	"math"
	"testing"
)

func TestPartitionRange(t *testing.T) {
	spec := &TableSpec{Name: "w", Rows: 10}
	p, err := NewPartitioner(PartitionRange, 3, spec)
	if err != nil {
		t.Fatal(err)
	}
	want := []int{0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2} // key 10 is beyond the rows: the last shard
	for k, w := range want {
		if got := p.Shard(uint64(k)); got != w {
			t.Errorf("key %d: shard %d, want %d", k, got, w)
		}
	}
	big, _ := NewPartitioner(PartitionRange, 7, &TableSpec{KeySpace: math.MaxUint64})
	if s := big.Shard(math.MaxUint64 - 1); s != 6 {
		t.Errorf("the top of a full key space: shard %d", s)
	}
	if _, err := NewPartitioner(PartitionRange, 2, &TableSpec{Name: "sparse"}); err == nil {
		t.Error("a range partition of an unbounded table")
	}
}

// TestPartitionHash: keys spread evenly, and going from 4 to 5 shards moves
// about a fifth of them (consistent hashing), all to the new shard.
func TestPartitionHash(t *testing.T) {
	p4, _ := NewPartitioner(PartitionHash, 4, &TableSpec{})
	p5, _ := NewPartitioner(PartitionHash, 5, &TableSpec{})
	const n = 200000
	count := make([]int, 4)
	moved := 0
	for k := range uint64(n) {
		a, b := p4.Shard(k), p5.Shard(k)
		count[a]++
		if a != b {
			moved++
			if b != 4 {
				t.Fatalf("key %d moved from shard %d to %d, not to the new shard", k, a, b)
			}
		}
	}
	for s, c := range count {
		if c < n/4*8/10 || c > n/4*12/10 {
			t.Errorf("shard %d holds %d of %d keys: uneven", s, c, n)
		}
	}
	if moved < n/5*7/10 || moved > n/5*13/10 {
		t.Errorf("%d of %d keys moved going to 5 shards, want about a fifth", moved, n)
	}
}
