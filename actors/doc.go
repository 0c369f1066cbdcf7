// Package actors hosts Phalanx's control plane: one protoactor-go actor
// system per process, logging through zap, optionally reachable from other
// processes over protoactor's gRPC remote, and the supervision strategy every
// Phalanx actor runs under (one-for-one restarts with exponential backoff and
// a restart budget, then giving up with a reason the process exits on). It
// carries small protobuf messages only; tensors go through collective/.
package actors
