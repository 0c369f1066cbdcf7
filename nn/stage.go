package nn

import (
	"errors"
	"fmt"
)

// StageOptions configure a Stage.
type StageOptions struct {
	// Recompute keeps only each micro-batch's input (and output) and runs the
	// forward again just before the backward (activation recomputation, as in
	// GPipe and Megatron): memory for one micro-batch's activations instead of
	// one per micro-batch in flight, for one more forward per micro-batch.
	Recompute bool
	// First: the stage is a model's first; a leading Dense skips its input gradient.
	First bool
}

// Stage runs a contiguous run of a model's layers as one pipeline stage, keeping one
// cache per micro-batch in flight.
//
// A micro-batch is known by its slot, any int >= 0 the caller chooses (a
// slot is reused once its backward is done): Forward(slot, x), then either
// Backward(slot, dy, ready) or BackwardInput(slot, dy) and later
// BackwardWeight(slot, ready), with other slots' calls in between in any
// order. Slots' buffers are allocated on their first use and reused.
//
// Without recomputation each slot selects the same slot of every layer (all
// of which are Slotted), and the caller keeps Forward's x valid until the
// slot's backward is done (the layers keep references to it), and
// BackwardInput's dy until the slot's BackwardWeight. With recomputation
// (StageOptions.Recompute, or any layer not Slotted) the stage copies x, so
// the caller may reuse it at once, and the layers keep one working cache.
//
// A Stage is not safe for concurrent use.
type Stage struct {
	layers    []Layer
	slotted   []Slotted  // per layer, nil where the layer is not one
	split     []Splitter // per layer, nil where the layer is not one
	params    []*Param
	counts    []int // len(layers[i].Params())
	recompute bool
	kept      []keptSlot // recomputation's per slot copies
}

// keptSlot is what a recomputing stage keeps of one micro-batch: its input
// to recompute from, and the output and input gradient it returned.
type keptSlot struct {
	in             Matrix
	inBuf, out, dx []float32
}

// NewStage makes a stage of layers, which it then owns: they must not run
// outside it while it has micro-batches in flight. A First stage sets a
// leading Dense's SkipInputGrad, as NewSequential does.
func NewStage(layers []Layer, o StageOptions) (*Stage, error) {
	if len(layers) == 0 {
		return nil, errors.New("nn: a stage needs at least one layer")
	}
	s := &Stage{
		layers:    layers,
		slotted:   make([]Slotted, len(layers)),
		split:     make([]Splitter, len(layers)),
		counts:    make([]int, len(layers)),
		recompute: o.Recompute,
	}
	for i, l := range layers {
		if l == nil {
			return nil, fmt.Errorf("nn: layer %d of the stage is nil", i)
		}
		sl, ok := l.(Slotted)
		if !ok {
			s.recompute = true
		}
		s.slotted[i] = sl
		s.split[i], _ = l.(Splitter)
		ps := l.Params()
		s.params = append(s.params, ps...)
		s.counts[i] = len(ps)
	}
	if o.First {
		if d, ok := layers[0].(*Dense); ok {
			d.SkipInputGrad = true
		}
	}
	return s, nil
}

// Params lists every layer's parameters, in layer order.
func (s *Stage) Params() []*Param { return s.params }

// Recomputes reports whether the stage recomputes each micro-batch's forward
// before its backward: when asked to, or when some layer is not Slotted (any
// Layer works, with one cache).
func (s *Stage) Recomputes() bool { return s.recompute }

// ActivationBytes is the size of the activation caches the stage holds now:
// every slot's buffers allocated so far in its layers (those with an
// ActivationBytes() int64 method, as Dense and ReLU have), and when
// recomputing, the kept inputs, outputs and input gradients.
func (s *Stage) ActivationBytes() int64 {
	var n int64
	for _, l := range s.layers {
		if a, ok := l.(interface{ ActivationBytes() int64 }); ok {
			n += a.ActivationBytes()
		}
	}
	for _, k := range s.kept {
		n += 4 * int64(cap(k.inBuf)+cap(k.out)+cap(k.dx))
	}
	return n
}

// Forward runs micro-batch slot's forward. Its result is valid until the same
// slot's next Forward. Without recomputation x must stay valid until the
// slot's backward is done.
func (s *Stage) Forward(slot int, x Matrix) Matrix {
	checkSlot(slot)
	if !s.recompute {
		return s.forward(slot, x)
	}
	k := slotOf(&s.kept, slot)
	k.in = resize(&k.inBuf, x.Rows, x.Cols)
	copy(k.in.Data, x.Data)
	y := s.forward(0, k.in)
	out := resize(&k.out, y.Rows, y.Cols)
	copy(out.Data, y.Data)
	return out
}

// Backward runs micro-batch slot's backward from dy, the gradient of its
// output, and returns its input's gradient (an empty Matrix for a First
// stage whose first layer is a Dense), valid until the slot's next backward.
// When ready is not nil it is called as Sequential.Backward calls it, with
// indices into Params.
func (s *Stage) Backward(slot int, dy Matrix, ready func(param int)) Matrix {
	checkSlot(slot)
	if !s.recompute {
		return s.backward(slot, dy, ready)
	}
	return s.recomputeBackward(slot, dy, ready)
}

// BackwardInput is the first half of Backward: the input's gradient, with
// Splitter layers leaving their parameters' gradients for BackwardWeight
// (and keeping dy, which must stay valid until then). When recomputing it is
// the whole Backward, for zero-bubble's split needs the caches recomputation
// gives up.
func (s *Stage) BackwardInput(slot int, dy Matrix) Matrix {
	checkSlot(slot)
	if s.recompute {
		return s.recomputeBackward(slot, dy, nil)
	}
	for i := len(s.layers) - 1; i >= 0; i-- {
		s.slotted[i].UseSlot(slot)
		if sp := s.split[i]; sp != nil {
			dy = sp.BackwardInput(dy)
		} else {
			dy = s.layers[i].Backward(dy)
		}
	}
	return dy
}

// BackwardWeight is the second half of Backward: the Splitter layers'
// parameters' gradients of the slot's BackwardInput. When ready is not nil
// it is then called for every parameter of the stage, last layer first, as
// each layer's gradient is complete. When recomputing it only calls ready.
func (s *Stage) BackwardWeight(slot int, ready func(param int)) {
	checkSlot(slot)
	end := len(s.params)
	for i := len(s.layers) - 1; i >= 0; i-- {
		if sp := s.split[i]; sp != nil && !s.recompute {
			s.slotted[i].UseSlot(slot)
			sp.BackwardWeight()
		}
		end = s.report(i, end, ready)
	}
}

// forward runs the layers on slot.
func (s *Stage) forward(slot int, x Matrix) Matrix {
	for i, l := range s.layers {
		if sl := s.slotted[i]; sl != nil {
			sl.UseSlot(slot)
		}
		x = l.Forward(x)
	}
	return x
}

// backward runs the layers backwards on slot.
func (s *Stage) backward(slot int, dy Matrix, ready func(int)) Matrix {
	end := len(s.params)
	for i := len(s.layers) - 1; i >= 0; i-- {
		if sl := s.slotted[i]; sl != nil {
			sl.UseSlot(slot)
		}
		dy = s.layers[i].Backward(dy)
		end = s.report(i, end, ready)
	}
	return dy
}

// recomputeBackward runs the forward again from the slot's kept input on
// the working cache (slot 0), then the backward, and keeps the input's
// gradient in the slot.
func (s *Stage) recomputeBackward(slot int, dy Matrix, ready func(int)) Matrix {
	if slot >= len(s.kept) {
		panic(fmt.Sprintf("nn: backward of stage slot %d, never forwarded", slot))
	}
	k := &s.kept[slot]
	s.forward(0, k.in)
	dx := s.backward(0, dy, ready)
	if len(dx.Data) == 0 {
		return dx
	}
	out := resize(&k.dx, dx.Rows, dx.Cols)
	copy(out.Data, dx.Data)
	return out
}

// report calls ready for layer i's parameters, whose indices end at end,
// last first, and returns where the previous layer's end.
func (s *Stage) report(i, end int, ready func(int)) int {
	n := s.counts[i]
	if ready != nil {
		for p := end - 1; p >= end-n; p-- {
			ready(p)
		}
	}
	return end - n
}

func checkSlot(slot int) {
	if slot < 0 {
		panic(fmt.Sprintf("nn: stage slot %d", slot))
	}
}
