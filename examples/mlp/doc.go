// Package mlp is the example classifier: a multi-layer perceptron (784 inputs,
// ReLU hidden layers, 10 classes) trained with softmax cross-entropy, on either
// a synthetic task generated deterministically from a seed (inputs from a
// standard normal, labels from a fixed random linear teacher) or MNIST read
// from IDX files.
package mlp
