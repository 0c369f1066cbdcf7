package worker

import (
	"fmt"
	"math/rand/v2"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/plant"
)

// Position is how far the job is through the data: the epoch, and how many
// samples of that epoch's shuffled order the whole job has consumed. It does
// not depend on the world size, so a job resumed with another number of ranks
// carries on from the same sample.
type Position struct {
	Epoch  int64
	Offset int64
}

// Sampler deals a dataset's samples to ranks: each epoch is a permutation
// drawn from (seed, epoch); the job walks it in global batches, and each rank
// takes a contiguous share of every global batch. Every sample is seen exactly
// once per epoch across the ranks, whatever the world size and however often
// it changes. A global batch never spans two epochs: the last one of an epoch
// is smaller.
type Sampler struct {
	n     int
	seed  uint64
	epoch int64
	perm  []int32
	pcg   rand.PCG   // reseeded for every epoch's permutation
	rng   *rand.Rand // over pcg
}

// NewSampler is a sampler over n samples.
func NewSampler(n int, seed uint64) (*Sampler, error) {
	if n <= 0 || n > 1<<31-1 {
		return nil, fmt.Errorf("worker: sampler over %d samples: want 1..2^31-1", n)
	}
	s := &Sampler{n: n, seed: seed, epoch: -1}
	s.rng = rand.New(&s.pcg)
	return s, nil
}

// Len is the number of samples per epoch.
func (s *Sampler) Len() int { return s.n }

func (s *Sampler) permutation(epoch int64) []int32 {
	if s.epoch == epoch {
		return s.perm
	}
	if s.perm == nil {
		s.perm = make([]int32, s.n)
	}
	for i := range s.perm {
		s.perm[i] = int32(i)
	}
	s.pcg.Seed(s.seed, uint64(epoch))
	s.rng.Shuffle(s.n, func(i, j int) { s.perm[i], s.perm[j] = s.perm[j], s.perm[i] })
	if plant.On(plant.SamplerDup) && epoch == 1 && s.n > 1 {
		s.perm[0] = s.perm[1] // planted: one sample dealt twice, another never
	}
	s.epoch = epoch
	return s.perm
}

// Batch appends to dst the indices rank takes from the global batch of up to
// global samples starting at pos, and returns them, the size of the whole
// global batch, and the position after it.
func (s *Sampler) Batch(pos Position, global, world, rank int, dst []int) (idx []int, size int, next Position, err error) {
	if global <= 0 || world <= 0 || rank < 0 || rank >= world {
		return nil, 0, pos, fmt.Errorf("worker: sampler batch of %d for rank %d of %d", global, rank, world)
	}
	if pos.Offset < 0 || pos.Offset >= int64(s.n) || pos.Epoch < 0 {
		return nil, 0, pos, fmt.Errorf("worker: sampler position %+v outside an epoch of %d samples", pos, s.n)
	}
	perm := s.permutation(pos.Epoch)
	size = min(global, s.n-int(pos.Offset))
	lo, hi := collective.ShardRange(size, world, rank)
	for _, i := range perm[int(pos.Offset)+lo : int(pos.Offset)+hi] {
		dst = append(dst, int(i))
	}
	next = Position{Epoch: pos.Epoch, Offset: pos.Offset + int64(size)}
	if next.Offset == int64(s.n) {
		next = Position{Epoch: pos.Epoch + 1}
	}
	return dst, size, next, nil
}
