// Package gpt is the language-model example, "gpt": a small GPT-2-style
// transformer (learned token and position embeddings, pre-norm blocks of
// causal multi-head attention and a GELU MLP, a final LayerNorm and a
// linear head) that predicts the next byte of text. It trains by default
// on the Go standard library's source under $(go env GOROOT)/src, which
// every machine with Go has offline, split deterministically into
// training and held-out files, or on a text file of the user's (--data).
// Its held-out measures are the loss in nats per character and the
// perplexity; Generate continues a prompt from trained parameters
// (phalanx sample).
//
// The model is written once against tensor-parallel layers (package tp):
// built with a tensor-parallel group it holds 1/T of the heads, the MLP,
// the vocabulary of the embedding and of the head, and computes the loss
// without gathering the logits; built without one it is the plain model.
package gpt
