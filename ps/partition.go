package ps

import (
	"fmt"
	"math/bits"
	"slices"
)

// Partition is how keys are split between shards.
type Partition uint8

// Partitions.
const (
	// PartitionRange splits a table's key space (its Rows, or KeySpace) into
	// contiguous, nearly equal ranges, one per shard; keys beyond it go to
	// the last shard.
	PartitionRange Partition = iota + 1
	// PartitionHash places keys on a consistent-hash ring with virtual
	// nodes: changing the number of shards moves about 1/n of the keys.
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

// vnodes is the number of points each shard has on the hash ring.
const vnodes = 128

// Partitioner maps a table's keys to shards 0..Shards-1. It is immutable and
// safe for concurrent use.
type Partitioner struct {
	kind   Partition
	shards int
	space  uint64 // range: the key space split
	ring   []uint64
	owner  []uint16 // owner[i] is the shard of ring point i
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
		type point struct {
			h     uint64
			shard uint16
		}
		pts := make([]point, 0, shards*vnodes)
		for s := range shards {
			for v := range vnodes {
				pts = append(pts, point{mix(uint64(s)<<32 | uint64(v) ^ 0x5851f42d4c957f2d), uint16(s)})
			}
		}
		slices.SortFunc(pts, func(a, b point) int {
			if a.h != b.h {
				if a.h < b.h {
					return -1
				}
				return 1
			}
			return int(a.shard) - int(b.shard)
		})
		for _, pt := range pts {
			p.ring = append(p.ring, pt.h)
			p.owner = append(p.owner, pt.shard)
		}
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
	h := mix(k ^ 0x2545f4914f6cdd1d)
	i, _ := slices.BinarySearch(p.ring, h)
	if i == len(p.ring) {
		i = 0
	}
	return int(p.owner[i])
}
