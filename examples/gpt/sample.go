package gpt

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Load sets every parameter from its logical tensor, which read fills
// by name (a checkpoint's tensors): a rank of a split model reads the
// whole tensor and keeps its slice.
func (m *Model) Load(read func(name string, dst []float32) error) error {
	var whole []float32
	for _, s := range m.Slices() {
		if err := s.Check(); err != nil {
			return err
		}
		if !s.Split() {
			if err := read(s.Local.Name, s.Local.Value); err != nil {
				return err
			}
			continue
		}
		n := 1
		for _, d := range s.Shape {
			n *= d
		}
		if cap(whole) < n {
			whole = make([]float32, n)
		}
		if err := read(s.Local.Name, whole[:n]); err != nil {
			return err
		}
		s.Take(whole[:n], s.Local.Value)
	}
	return nil
}

// Generate continues prompt by n characters, each drawn from the model's
// next-character distribution at temperature t (0: the likeliest), with
// the randomness of seed: the same seed gives the same text. The model
// reads at most its Context last characters. It needs the whole model
// (built without a tensor-parallel group).
func (m *Model) Generate(prompt []byte, n int, t float64, seed uint64) ([]byte, error) {
	switch {
	case m.comm != nil:
		return nil, errors.New("gpt: generating needs the whole model, not a tensor-parallel part")
	case t < 0 || math.IsNaN(t):
		return nil, fmt.Errorf("gpt: temperature %v: want 0 or more", t)
	case n < 0:
		return nil, fmt.Errorf("gpt: %d characters to generate", n)
	}
	if len(prompt) == 0 {
		prompt = []byte("\n")
	}
	rng := rand.New(rand.NewPCG(seed, 0x73616d))
	text := append([]byte(nil), prompt...)
	ids := make([]int32, m.Context)
	p := make([]float64, Vocab)
	for range n {
		window := text[max(0, len(text)-m.Context):]
		clear(ids)
		for i, c := range window {
			ids[i] = int32(c)
		}
		x, err := m.emb.Lookup(ids)
		if err != nil {
			return nil, err
		}
		logits := m.body.Forward(x).Row(len(window) - 1)
		text = append(text, byte(draw(logits, t, p, rng)))
	}
	return text, nil
}

// draw picks an index of logits: the largest at temperature 0, else one
// drawn from softmax(logits / t).
func draw(logits []float32, t float64, p []float64, rng *rand.Rand) int {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if t == 0 {
		return best
	}
	var total float64
	for i, v := range logits {
		p[i] = math.Exp((float64(v) - float64(logits[best])) / t)
		total += p[i]
	}
	u := rng.Float64() * total
	for i, w := range p[:len(logits)] {
		if u -= w; u < 0 {
			return i
		}
	}
	return best
}
