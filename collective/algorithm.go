package collective

import (
	"fmt"
	"strings"
)

// Algorithm names how AllReduce moves data. Every value but AlgoAuto is an
// algorithm that runs, and its number is the algorithm id a frame header (and
// a shared-memory slab's descriptor) carries in arg bits 8–15, so that ranks
// running an allreduce differently are caught at the first frame.
type Algorithm uint8

// Allreduce algorithms. The numbers are wire ids: never reuse or reorder them.
const (
	// AlgoAuto lets chooseAllReduce pick; it never runs and is never on the wire.
	AlgoAuto Algorithm = iota
	// AlgoRing is the chunked, pipelined ring: bandwidth-optimal, 2(N-1) steps.
	AlgoRing
	// AlgoRecursiveDoubling exchanges whole vectors along a butterfly (the
	// log-depth, tree-shaped family): latency-optimal, ceil(log2 N) rounds.
	AlgoRecursiveDoubling
	// AlgoSingleCopy is the shared-memory single-copy allreduce of a group
	// whose peers are all on shared memory of one host: each rank copies its
	// input into its own segment once and reduces out of its peers' (float32
	// and float64 only; shm_allreduce.go).
	AlgoSingleCopy
	// AlgoHierarchical reduce-scatters inside each host over shared memory,
	// runs one ring per local shard across the hosts, and allgathers inside
	// each host (hier_allreduce.go).
	AlgoHierarchical
)

// lastAlgorithm is the highest algorithm id.
const lastAlgorithm = AlgoHierarchical

var algorithmNames = []string{AlgoAuto: "auto", AlgoRing: "ring", AlgoRecursiveDoubling: "rd",
	AlgoSingleCopy: "single-copy", AlgoHierarchical: "hierarchical"}

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// onWire reports whether a is an algorithm id a peer may send.
func (a Algorithm) onWire() bool { return a >= AlgoRing && a <= lastAlgorithm }

// ParseAlgorithm accepts every Algorithm's String form ("auto", "ring",
// "rd", "single-copy", "hierarchical"), "tree" as an alias of "rd", and ""
// as "auto".
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "":
		return AlgoAuto, nil
	case "tree":
		return AlgoRecursiveDoubling, nil
	}
	for a, name := range algorithmNames {
		if s == name {
			return Algorithm(a), nil
		}
	}
	return 0, fmt.Errorf("collective: unknown algorithm %q (want ring, tree, rd, single-copy, hierarchical or auto)", s)
}

// allreducePaths is what a group's connections allow beyond the flat
// algorithms (ring, recursive doubling), which run over any links. newGroup
// sets at most one of them.
type allreducePaths struct {
	singleCopy   bool // every peer on shared memory of one host (Group.fast)
	hierarchical bool // several hosts of as many ranks each, shared memory inside each (Group.hier)
}

func (g *Group) allreducePaths() allreducePaths {
	return allreducePaths{singleCopy: g.fast != nil, hierarchical: g.hier != nil}
}

// singleCopyReduces reports whether the single-copy allreduce reduces dt;
// other dtypes take the links.
func singleCopyReduces(dt DType) bool { return dt == Float32 || dt == Float64 }

// chooseAllReduce is where an allreduce's algorithm is decided, and the only
// place: from what the caller asked for (want), the message's size in bytes
// and dtype, what the group's connections allow (p) and its options. Every
// rank decides alike when they agree on these; when they do not, the
// algorithm ids in their frames differ and the allreduce fails with
// ErrMismatch.
//
// AlgoAuto takes Options.Algorithm, and when that is AlgoAuto too,
// recursive doubling up to Options.SmallBytes and the ring above. The ring
// and recursive doubling then give way to what the connections allow: on
// shared memory of one host the single-copy allreduce replaces either, for
// float32 and float64; across hosts of several ranks each the hierarchical
// allreduce replaces the ring (recursive doubling stays flat). Asked for
// explicitly, the single-copy and hierarchical allreduces are an error where
// the group cannot run them, as is an unknown algorithm.
func chooseAllReduce(want Algorithm, bytes int, dt DType, p allreducePaths, o Options) (Algorithm, error) {
	a := want
	if a == AlgoAuto {
		a = o.Algorithm
	}
	if a == AlgoAuto {
		a = AlgoRing
		if bytes <= o.SmallBytes {
			a = AlgoRecursiveDoubling
		}
	}
	switch a {
	case AlgoRing, AlgoRecursiveDoubling:
		switch {
		case p.singleCopy && singleCopyReduces(dt):
			return AlgoSingleCopy, nil
		case p.hierarchical && a == AlgoRing:
			return AlgoHierarchical, nil
		}
		return a, nil
	case AlgoSingleCopy:
		if !p.singleCopy {
			return a, fmt.Errorf("the single-copy allreduce needs every peer on shared memory of one host")
		}
		if !singleCopyReduces(dt) {
			return a, fmt.Errorf("the single-copy allreduce reduces float32 and float64, not %s", dt)
		}
		return a, nil
	case AlgoHierarchical:
		if !p.hierarchical {
			return a, fmt.Errorf("the hierarchical allreduce needs several hosts of as many ranks each, on shared memory inside each")
		}
		return a, nil
	}
	return a, fmt.Errorf("unknown algorithm %s", a)
}

// allreducePlan says which algorithms chooseAllReduce picks for an
// AllReduce that leaves the choice to the group (AlgoAuto), by dtype and
// size: for DataPlane.
func allreducePlan(p allreducePaths, o Options) string {
	bySize := func(dt DType) string {
		small, err := chooseAllReduce(AlgoAuto, o.SmallBytes, dt, p, o)
		if err != nil {
			return "none, " + err.Error()
		}
		large, _ := chooseAllReduce(AlgoAuto, o.SmallBytes+1, dt, p, o)
		if small == large {
			return small.String()
		}
		return fmt.Sprintf("%s up to %s, %s above", small, sizeText(o.SmallBytes), large)
	}
	// Float32 and Float64 are the dtypes the single-copy allreduce reduces,
	// Float16 stands for the others.
	wide, others := bySize(Float32), bySize(Float16)
	if wide == others {
		return wide
	}
	return "float32 and float64 " + wide + "; other dtypes " + others
}

// sizeText writes n bytes exactly, in the largest unit that divides it.
func sizeText(n int) string {
	switch {
	case n > 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n > 0 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// allreduceArg packs what every rank of an allreduce must agree on: the
// reduction (bits 0–7) and the algorithm that runs (bits 8–15).
func allreduceArg(op ReduceOp, a Algorithm) uint32 { return uint32(op) | uint32(a)<<8 }

// argAlgorithm is the algorithm id of an allreduce's or reduce-scatter's arg.
func argAlgorithm(arg uint32) Algorithm { return Algorithm(arg >> 8) }

// unknownAlgorithm describes an algorithm id this rank does not know.
func unknownAlgorithm(a Algorithm) string {
	known := make([]string, 0, lastAlgorithm)
	for k := AlgoRing; k <= lastAlgorithm; k++ {
		known = append(known, fmt.Sprintf("%d %s", k, k))
	}
	return fmt.Sprintf("unknown allreduce algorithm id %d (this rank knows %s)", uint8(a), strings.Join(known, ", "))
}

func describeArg(op opCode, arg uint32) string {
	switch op {
	case opAllReduce, opReduceScatter:
		return fmt.Sprintf("%s via %s", ReduceOp(arg&0xff), argAlgorithm(arg))
	case opBroadcast:
		return fmt.Sprintf("root %d", arg)
	}
	return fmt.Sprint(arg)
}
