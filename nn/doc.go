// Package nn is the small neural-network library of the examples: float32
// parameters with their gradients, Dense, ReLU, Embedding and softmax
// cross-entropy layers with hand-written backward passes, matrix products
// through one BLAS chosen at build time (see BLAS: gonum's pure Go by default
// and without cgo; OpenBLAS, one thread per process, with cgo and the build
// tag openblas), and the optimizers and learning-rate schedules that
// update them. It is not a general autograd framework: a model is a fixed
// stack of layers whose buffers are allocated once and reused every step.
//
// For pipeline parallelism a Stage runs a contiguous run of a model's layers
// with several micro-batches in flight, each in its own cache slot: layers
// that are Slotted (Dense, ReLU) keep one cache per slot, and a Splitter
// (Dense) splits its backward into the input's gradient and, later, the
// weights', as zero-bubble schedules need. A stage may instead recompute each
// micro-batch's forward before its backward, keeping only its input and
// output; a stage with any layer that is not Slotted always does.
package nn
