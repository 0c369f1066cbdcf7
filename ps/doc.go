// Package ps is Phalanx's parameter server: parameters live in shards, each
// owned by a supervised ShardActor, and workers pull the rows their batch
// needs and push gradients over a batched binary TCP data plane.
//
// A table is a set of rows of Dim float32s keyed by uint64: a dense tensor is
// a table whose rows all exist from the start, a sparse embedding table
// creates a row on its first touch with a deterministic initialiser. Keys are
// split between shards by range or by consistent hash (Partitioner); the
// shard map (which server is the primary and which are backups of each shard)
// lives in etcd. Server-side optimizers (SGD, Adagrad, Adam) keep per-row
// state. Consistency is bsp, asp, ssp (bounded staleness) or hybrid (a
// clock closes at a quorum or a deadline; later pushes are stale). A push is
// acknowledged only once every replica of its shard has applied it.
package ps
