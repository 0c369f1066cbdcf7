// Package examples holds the example models that ship with Phalanx and
// registers them by name for the phalanx command: mlp (a classifier trained
// data-parallel over a ring), sparse-lr (logistic regression over
// parameter servers) and deep-mlp (a deep perceptron cut into pipeline
// stages) and gpt (a character-level transformer language model). Each example is a package of its own; examples/embed
// is a program that embeds the runtime with a model of its own.
package examples

import (
	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/examples/deepmlp"
	"github.com/phalanx-rt/phalanx/examples/gpt"
	"github.com/phalanx-rt/phalanx/examples/mlp"
	"github.com/phalanx-rt/phalanx/examples/sparselr"
)

// Registry is a new registry of the built-in models.
func Registry() *phalanx.Registry {
	return phalanx.NewRegistry(mlp.Spec(), sparselr.ModelSpec(), deepmlp.Spec(), gpt.Spec())
}
