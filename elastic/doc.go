// Package elastic runs one worker process through the generations of an
// elastic job. An Agent registers the worker in etcd under a lease, waits for
// the coordinator to place it in a ring, builds that ring's collective group,
// and runs the caller's training round in it. When the coordinator decides a
// newer generation (a worker lost or joined), the agent aborts the round in
// flight with ErrGenerationChanged and builds the next ring: the process keeps
// running, and the round body rolls back to its last commit and resyncs. When
// the round's group breaks (a peer's connection reset), the agent reports the
// loss so that the coordinator can verify it and decide at once, instead of
// waiting for the lease to expire.
package elastic
