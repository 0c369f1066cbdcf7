// Package collective is Phalanx's data plane: groups of ranks connected by a
// Transport (framed TCP, shared memory between ranks of one host, or
// in-process pipes for tests) running AllReduce, ReduceScatter, AllGather,
// Broadcast, Barrier and point-to-point Send/Recv on raw little-endian tensor
// bytes.
//
// A Group belongs to one job and one generation. Every frame carries both, plus
// the operation's sequence number, so a frame from another job or a dead
// generation is refused rather than summed. A failed operation (a peer lost,
// silent past the deadline, or calling something else) leaves the group
// unusable on every rank; callers close it and join generation+1.
//
// A failed operation returns only once nothing of the group reads or
// writes the caller's buffers any more: a receive under way is abandoned,
// not finished later. Buffers the operation only reads (AllGather's and
// ReduceScatter's in, Broadcast's b on the root, Send's b) are as they
// were. Buffers it writes (AllReduce's b, the outputs of AllGather and
// ReduceScatter, Broadcast's b on the other ranks, Recv's b, the gathered
// shares of AllGatherInPlace and AllGatherRanges) hold unspecified bytes:
// any mix of their old contents, peers' data and partial reductions. A
// caller that needs them restores its own copy (worker.Trainer rolls back
// to its last commit). Membership and
// the choice of generation are not this package's business: see coordinator/
// and elastic/.
//
// # Allreduce algorithms
//
// AllReduce runs one of four algorithms (Algorithm), one file each:
//
//   - AlgoRing (ring.go): the chunked, pipelined ring, bandwidth-optimal;
//     ReduceScatter and AllGather are step ranges of the same ring.
//   - AlgoRecursiveDoubling (recursive_doubling.go): whole-vector exchanges
//     along a butterfly, ceil(log2 N) rounds, latency-optimal.
//   - AlgoSingleCopy (shm_allreduce.go): every peer on shared memory of one
//     host; each rank copies its input into its own segment once and reduces
//     straight out of its peers' segments, with no frames on the links.
//     float32 and float64 only.
//   - AlgoHierarchical (hier_allreduce.go): several hosts with the same
//     number (at least two) of ranks each, shared memory inside each host;
//     reduce-scatter inside each host, one ring per local shard across the
//     hosts, allgather inside each host, so each byte crosses the network
//     once per host rather than once per rank.
//
// One function, chooseAllReduce (algorithm.go), picks the algorithm of each
// AllReduce, from the algorithm asked for, the message's size and dtype,
// what the group's connections allow (fixed when the group is built) and
// the Options. Left to the group (AlgoAuto), it takes Options.Algorithm, and
// when that is AlgoAuto too, recursive doubling up to Options.SmallBytes
// (64 KiB) and the ring above. Then, on shared memory of one host, the
// single-copy allreduce replaces either for float32 and float64; across
// hosts of several ranks each, the hierarchical allreduce replaces the ring.
// The algorithm chosen is the one that runs: each implementation runs only
// itself. Its id travels in every frame header (and every shared-memory slab
// descriptor) of the allreduce, so ranks that would run different
// algorithms fail with ErrMismatch, and an id this rank does not know is an
// ErrProtocol. Group.LastAlgorithm says which algorithm the latest AllReduce
// ran, and Group.DataPlane, after the plane, which ones the group chooses.
package collective
