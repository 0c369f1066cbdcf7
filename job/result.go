package job

import (
	"github.com/phalanx-rt/phalanx/elastic"
)

// ErrLeft is RunWorker's answer when its context was cancelled and the
// worker left the job gracefully: the others go on without it.
var ErrLeft = elastic.ErrLeft

// StoppedError: the job stopped before its last step (elastic's, the one
// stop error).
type StoppedError = elastic.StoppedError

// Result is how a job ended, as a worker saw it.
type Result struct {
	Step       int64
	Generation uint64
	World      int
	// Loss and Accuracy are over Task.Test (when given and the model is a
	// worker.Evaluator).
	Loss, Accuracy float64
	// ParametersIdentical: every rank ended with bitwise the same
	// parameters.
	ParametersIdentical bool
	// ParametersCRC is the CRC32C (Castagnoli) of rank 0's parameters, in
	// order, as float32 little-endian: two runs whose checksums match ended
	// with the same model (chaos compares a run with its undisturbed twin).
	ParametersCRC uint32
	// RankCRCs are every rank's ParametersCRC, by rank: which rank
	// differs, when they are not identical.
	RankCRCs []uint32
	// Metrics are a parameter-server model's held-out measures, or a ring
	// model's Task.Measures.
	Metrics map[string]float64
}
