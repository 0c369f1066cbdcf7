// Package nn is the small neural-network library of the examples: float32
// parameters with their gradients, Dense, ReLU, Embedding and softmax
// cross-entropy layers with hand-written backward passes, matrix products
// through gonum's BLAS, and the optimizers and learning-rate schedules that
// update them. It is not a general autograd framework: a model is a fixed
// stack of layers whose buffers are allocated once and reused every step.
package nn
