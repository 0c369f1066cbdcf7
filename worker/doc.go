// Package worker is a rank's training runtime: the Model and Dataset
// interfaces a user implements, the distributed sampler, the committed State
// (Horovod's commit/restore/sync), and the Trainer that runs data-parallel
// steps over a collective.Group — gradient averaging every step, or local SGD
// with parameter averaging every K steps, with gradient accumulation over
// micro-batches. It does no process management or membership; the actors and
// the coordinator drive it.
package worker
