package collective

import (
	"context"
	"fmt"
)

// DefaultBucketBytes is the fusion buffer size of AllReduceTensors, as in
// PyTorch DDP and Horovod.
const DefaultBucketBytes = 25 << 20

// Fuser allreduces many tensors in a few large operations: tensors are laid
// out, in order, into buckets of up to BucketBytes; a bucket is reduced as
// soon as all its tensors are marked ready, on a goroutine of the Fuser, while
// the caller fills the next ones (overlap with computation). Buckets are
// reduced strictly in order, so every rank issues the same operations. A
// tensor larger than a bucket is reduced in place, without a copy.
//
// Tensors must be marked ready in the same bucket order on every rank. A Fuser
// is driven by one goroutine; buffers and channels are reused from round to
// round, so a training step costs no allocation.
type Fuser[T Float] struct {
	ctx     context.Context // of the background allreduces
	g       *Group
	op      ReduceOp
	tensors [][]T
	buckets []bucket[T]
	where   []int // tensor → bucket
	launch  chan int
	done    []chan error
	pending []int   // tensors of each bucket not yet ready; -1 once launched
	ready   []bool  // tensor marked ready this round
	got     []bool  // bucket's result received this round
	errs    []error // bucket's result
}

type bucket[T Float] struct {
	first, last int // tensors [first, last)
	fused       []T // nil when the bucket is one tensor reduced in place
	offs        []int
}

// NewFuser lays tensors out into buckets of at most bucketBytes (0 means
// DefaultBucketBytes) and starts the Fuser's goroutine, whose allreduces run
// under ctx; Close stops it.
func NewFuser[T Float](ctx context.Context, g *Group, tensors [][]T, op ReduceOp, bucketBytes int) *Fuser[T] {
	if bucketBytes <= 0 {
		bucketBytes = DefaultBucketBytes
	}
	var z T
	es := len(bytesOf([]T{z}))
	f := &Fuser[T]{ctx: ctx, g: g, op: op, tensors: tensors, where: make([]int, len(tensors)), launch: make(chan int, len(tensors)+1)}
	for i := 0; i < len(tensors); {
		b := bucket[T]{first: i}
		size := 0
		for i < len(tensors) && (i == b.first || size+len(tensors[i])*es <= bucketBytes) {
			b.offs = append(b.offs, size/es)
			size += len(tensors[i]) * es
			f.where[i] = len(f.buckets)
			i++
		}
		b.last = i
		if b.last-b.first > 1 {
			b.fused = make([]T, size/es)
		}
		f.buckets = append(f.buckets, b)
	}
	f.done = make([]chan error, len(f.buckets))
	for k := range f.done {
		f.done[k] = make(chan error, 1)
	}
	f.pending = make([]int, len(f.buckets))
	f.ready = make([]bool, len(tensors))
	f.got = make([]bool, len(f.buckets))
	f.errs = make([]error, len(f.buckets))
	f.Reset()
	go f.run()
	return f
}

// Reset prepares the Fuser for another round (the next step). A bucket
// launched and not waited for is waited for first (the group's timeout bounds
// it), so no result of this round leaks into the next.
func (f *Fuser[T]) Reset() {
	for k, b := range f.buckets {
		if f.pending[k] < 0 && !f.got[k] {
			<-f.done[k]
		}
		f.pending[k] = b.last - b.first
		f.got[k], f.errs[k] = false, nil
	}
	clear(f.ready)
}

func (f *Fuser[T]) run() {
	for k := range f.launch {
		b := &f.buckets[k]
		var err error
		if b.fused == nil {
			err = f.g.AllReduce(f.ctx, Of(f.tensors[b.first]), f.op)
		} else {
			err = f.g.AllReduce(f.ctx, Of(b.fused), f.op)
		}
		f.done[k] <- err
	}
}

// MarkReady says tensor i holds its final local value: it is copied into its
// bucket, and a bucket whose tensors are all ready is reduced. Buckets are
// launched in order; a bucket ready before an earlier one waits for it.
func (f *Fuser[T]) MarkReady(i int) error {
	if i < 0 || i >= len(f.tensors) {
		return fmt.Errorf("collective fuser: tensor %d outside 0..%d", i, len(f.tensors)-1)
	}
	if f.ready[i] {
		return fmt.Errorf("collective fuser: tensor %d marked ready twice in one round", i)
	}
	f.ready[i] = true
	k := f.where[i]
	b := &f.buckets[k]
	if b.fused != nil {
		copy(b.fused[b.offs[i-b.first]:], f.tensors[i])
	}
	f.pending[k]--
	for k := range f.buckets { // launch every leading bucket that is complete
		if f.pending[k] > 0 {
			break
		}
		if f.pending[k] == 0 {
			f.pending[k] = -1 // launched
			f.launch <- k
		}
	}
	return nil
}

// WaitBucket waits for bucket k's allreduce and copies its results back.
func (f *Fuser[T]) WaitBucket(ctx context.Context, k int) error {
	if k < 0 || k >= len(f.buckets) {
		return fmt.Errorf("collective fuser: bucket %d outside 0..%d", k, len(f.buckets)-1)
	}
	if f.pending[k] >= 0 {
		return fmt.Errorf("collective fuser: bucket %d not launched: %d of its tensors are not marked ready", k, f.pending[k])
	}
	if f.got[k] {
		return f.errs[k] // results were copied back by the first wait
	}
	select {
	case err := <-f.done[k]:
		f.got[k], f.errs[k] = true, err
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	b := &f.buckets[k]
	if b.fused != nil {
		for i := b.first; i < b.last; i++ {
			copy(f.tensors[i], b.fused[b.offs[i-b.first]:])
		}
	}
	return nil
}

// Wait waits for every bucket; every tensor must have been marked ready.
func (f *Fuser[T]) Wait(ctx context.Context) error {
	for k := range f.buckets {
		if f.pending[k] > 0 {
			return fmt.Errorf("collective fuser: bucket %d still has %d tensors not marked ready", k, f.pending[k])
		}
		if err := f.WaitBucket(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

// Buckets is the number of buckets.
func (f *Fuser[T]) Buckets() int { return len(f.buckets) }

// Close stops the Fuser's goroutine.
func (f *Fuser[T]) Close() { close(f.launch) }

// AllReduceTensors reduces every tensor in place, fused into buckets of
// bucketBytes (0: DefaultBucketBytes).
func AllReduceTensors[T Float](ctx context.Context, g *Group, tensors [][]T, op ReduceOp, bucketBytes int) error {
	f := NewFuser(ctx, g, tensors, op, bucketBytes)
	defer f.Close()
	for i := range tensors {
		if err := f.MarkReady(i); err != nil {
			return err
		}
	}
	return f.Wait(ctx)
}
