// Package phalanx is the Phalanx runtime: elastic, fault-tolerant,
// checkpointed data-parallel training of a Go program's own model.
package phalanx
