// Package nn is the small neural-network library of the examples: float32
// parameters with their gradients, Dense, ReLU, Embedding and softmax
// cross-entropy layers with hand-written backward passes, matrix products
// through one BLAS chosen at build time (see BLAS: gonum's pure Go by default
// and without cgo; OpenBLAS, one thread per process, with cgo and the build
// tag openblas), and the optimizers and learning-rate schedules that
// update them. It is not a general autograd framework: a model is a fixed
// stack of layers whose buffers are allocated once and reused every step.
package nn
