// Package collective is Phalanx's data plane: groups of ranks connected by a
// Transport (framed TCP, or in-process pipes for tests) running AllReduce,
// ReduceScatter, AllGather, Broadcast, Barrier and point-to-point Send/Recv on
// raw little-endian tensor bytes.
//
// A Group belongs to one job and one generation. Every frame carries both, plus
// the operation's sequence number, so a frame from another job or a dead
// generation is refused rather than summed. A failed operation (a peer lost,
// silent past the deadline, or calling something else) leaves the group
// unusable on every rank; callers close it and join generation+1. Membership and
// the choice of generation are not this package's business: see coordinator/
// and elastic/.
package collective
