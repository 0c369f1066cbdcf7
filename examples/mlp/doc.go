// Package mlp is the example classifier: a multi-layer perceptron (784 inputs,
// ReLU hidden layers, 10 classes) trained with softmax cross-entropy, on either
// a synthetic task generated deterministically from a seed (inputs that mix
// 16 hidden factors, labels from a fixed random linear teacher of the factors) or MNIST read
// from IDX files.
package mlp
