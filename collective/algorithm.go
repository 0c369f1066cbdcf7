package collective

import "fmt"

// Algorithm selects how AllReduce moves data.
type Algorithm uint8

// Allreduce algorithms.
const (
	// AlgoAuto uses recursive doubling up to Options.SmallBytes, the ring above.
	AlgoAuto Algorithm = iota
	// AlgoRing is the chunked, pipelined ring: bandwidth-optimal, 2(N-1) steps.
	AlgoRing
	// AlgoRecursiveDoubling exchanges whole vectors along a butterfly (the
	// log-depth, tree-shaped family): latency-optimal, ceil(log2 N) rounds.
	AlgoRecursiveDoubling
)

func (a Algorithm) String() string {
	switch a {
	case AlgoAuto:
		return "auto"
	case AlgoRing:
		return "ring"
	case AlgoRecursiveDoubling:
		return "rd"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm accepts "auto", "ring", "rd" and its alias "tree".
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "auto", "":
		return AlgoAuto, nil
	case "ring":
		return AlgoRing, nil
	case "rd", "tree":
		return AlgoRecursiveDoubling, nil
	}
	return 0, fmt.Errorf("collective: unknown algorithm %q (want ring, tree, rd or auto)", s)
}

// choose resolves AlgoAuto for a message of n bytes.
func (g *Group) choose(a Algorithm, n int) Algorithm {
	if a == AlgoAuto {
		a = g.opts.Algorithm
	}
	if a != AlgoAuto {
		return a
	}
	if n <= g.opts.SmallBytes {
		return AlgoRecursiveDoubling
	}
	return AlgoRing
}

// allreduceArg packs what every rank of an allreduce must agree on.
func allreduceArg(op ReduceOp, a Algorithm) uint32 { return uint32(op) | uint32(a)<<8 }

func describeArg(op opCode, arg uint32) string {
	switch op {
	case opAllReduce, opReduceScatter:
		return fmt.Sprintf("%s via %s", ReduceOp(arg&0xff), Algorithm(arg>>8))
	case opBroadcast:
		return fmt.Sprintf("root %d", arg)
	}
	return fmt.Sprint(arg)
}
