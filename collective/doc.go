// Package collective is Phalanx's data plane: groups of ranks connected by a
// Transport (framed TCP, or in-process pipes for tests) running AllReduce,
// ReduceScatter, AllGather, Broadcast, Barrier and point-to-point Send/Recv on
// raw little-endian tensor bytes.
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
package collective
