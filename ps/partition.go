package ps

import (
	"fmt"
	"math/bits"
)

// Partition is how keys are split between shards.
type Partition uint8

// Partitions.
const (
	// PartitionRange splits a table's key space (its Rows, or KeySpace) into
	// contiguous, nearly equal ranges, one per shard; keys beyond it go to
	// the last shard.
	PartitionRange Partition = iota + 1
	// PartitionHash places keys by a consistent hash (jump hash): going
	// from n to n+1 shards moves 1/(n+1) of the keys, all to the new one.
	PartitionHash
)

// ParsePartition reads range or hash.
func ParsePartition(s string) (Partition, error) {
	switch s {
	case "range":
		return PartitionRange, nil
	case "hash":
		return PartitionHash, nil
	}
	return 0, fmt.Errorf("ps: partition %q: want range or hash", s)
}

func (p Partition) String() string {
	switch p {
	case PartitionRange:
		return "range"
	case PartitionHash:
		return "hash"
	}
	return fmt.Sprintf("partition(%d)", uint8(p))
}

// Partitioner maps a table's keys to shards 0..Shards-1. It is immutable and
// safe for concurrent use.
type Partitioner struct {
	kind   Partition
	shards int
	space  uint64 // range: the key space split
}

// NewPartitioner splits spec's keys between shards.
func NewPartitioner(kind Partition, shards int, spec *TableSpec) (*Partitioner, error) {
	if shards < 1 || shards > 1<<16 {
		return nil, fmt.Errorf("ps: %d shards: want 1..65536", shards)
	}
	p := &Partitioner{kind: kind, shards: shards}
	switch kind {
	case PartitionRange:
		p.space = spec.Rows
		if p.space == 0 {
			p.space = spec.KeySpace
		}
		if p.space == 0 {
			return nil, fmt.Errorf("ps: table %q: a range partition needs the table's rows or key space", spec.Name)
		}
	case PartitionHash:
	default:
		return nil, fmt.Errorf("ps: unknown partition %d", kind)
	}
	return p, nil
}

// Shards is the number of shards.
func (p *Partitioner) Shards() int { return p.shards }

// Shard is the shard of key k.
func (p *Partitioner) Shard(k uint64) int {
	if p.kind == PartitionRange {
		if k >= p.space {
			return p.shards - 1
		}
		// floor(k × shards / space) without overflow
		hi, lo := bits.Mul64(k, uint64(p.shards))
		q, _ := bits.Div64(hi, lo, p.space)
		return int(q)
	}
	return jump(mix(k^0x2545f4914f6cdd1d), p.shards)
}

// jump is Lamping and Veach's jump consistent hash of h into n buckets:
// going from n to n+1 buckets moves 1/(n+1) of the keys, all to the new
// one; it needs no table and about ln n steps.
func jump(h uint64, n int) int {
	b, j := int64(-1), int64(0)
	for j < int64(n) {
		b = j
		h = h*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(1<<31) / float64(h>>33+1)))
	}
	return int(b)
}
