// Package checkpoint saves and restores a data-parallel job's training state
// in object storage: an S3-compatible store (MinIO, through minio-go) or a
// local directory.
//
// A checkpoint is a directory of objects under the store's prefix, named
// after the step it holds. The state is one logical byte stream (every
// tensor's float32 elements in order); each writing rank stores one
// contiguous, block-aligned piece of it as a shard object, and rank 0 writes
// the manifest last, once every shard is stored. The manifest
// (phalanx.v1.Manifest) lists the tensors, where their bytes are, and a
// CRC32C of every block, tensor and object; a checkpoint without one does not
// exist, so a reader never sees a half-written checkpoint. Nothing is ever
// written twice under one name.
//
// A Checkpointer drives saving inside a training loop: at a step boundary it
// copies the state in memory and uploads it in the background, one
// checkpoint in flight at a time, and the ranks agree on every decision
// through votes carried by the step's own allreduce. Restore loads the
// newest checkpoint that verifies into a group of any size: each rank reads
// a share of the blocks and the group gathers them over the data plane.
package checkpoint
