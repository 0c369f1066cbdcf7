package nn

import "fmt"

// Slotted is a Layer that keeps several forward passes in flight (a pipeline
// stage's micro-batches): UseSlot(i) makes the following Forward and Backward
// (and BackwardInput/BackwardWeight) use cache slot i, i >= 0, growing the
// slots as needed. Slot 0 is the one a plain Forward/Backward has always used.
//
// Every per-pass buffer is per slot: the kept input and output (the next
// layer keeps the output as its input until its backward), the input
// gradient (a split backward keeps it as the previous layer's dy until its
// BackwardWeight) and the kept dy. Each slot's buffers are allocated once and
// reused.
type Slotted interface {
	Layer
	UseSlot(i int)
}

// Splitter is a layer whose backward splits in two, as zero-bubble pipeline
// schedules need: BackwardInput returns the input's gradient only and keeps
// dy in the current slot; BackwardWeight later adds the parameters' gradients
// of that slot's last BackwardInput (with the slot selected again by UseSlot).
type Splitter interface {
	BackwardInput(dy Matrix) Matrix
	BackwardWeight()
}

var (
	_ Slotted  = (*Dense)(nil)
	_ Splitter = (*Dense)(nil)
	_ Slotted  = (*ReLU)(nil)
	_ Slotted  = (*LayerNorm)(nil)
	_ Splitter = (*LayerNorm)(nil)
	_ Slotted  = (*GELU)(nil)
	_ Slotted  = (*CausalAttention)(nil)
	_ Slotted  = (*Positions)(nil)
	_ Slotted  = (*Residual)(nil)
)

// useSlot selects slot i of *slots, growing it to hold i.
func useSlot[T any](slots *[]T, cur *int, i int) {
	if i < 0 {
		panic(fmt.Sprintf("nn: cache slot %d", i))
	}
	slotOf(slots, i)
	*cur = i
}

// slotOf is slot i of *slots, grown with zero slots when needed.
func slotOf[T any](slots *[]T, i int) *T {
	for len(*slots) <= i {
		var zero T
		*slots = append(*slots, zero)
	}
	return &(*slots)[i]
}
