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
// With a 16-bit wire type (FuserOptions.Wire) each tensor is rounded into its
// bucket's wire buffer when it is marked ready, the bucket is reduced in that
// type (in float32 arithmetic, see reduceInto) at half the bytes, and the
// result is widened back into the tensors when the bucket is waited for.
//
// Tensors must be marked ready in the same bucket order on every rank. A Fuser
// is driven by one goroutine; buffers and channels are reused from round to
// round, so a training step costs no allocation.
type Fuser[T Float] struct {
	ctx     context.Context // of the background allreduces
	g       *Group
	op      ReduceOp
	wire    DType // Float16 or BFloat16; 0: the tensors travel as they are
	tensors [][]T
	resid   [][]float32 // error feedback: each tensor's rounding residue
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
	wire        []uint16
	offs        []int
}

// FuserOptions configures a Fuser (and AllReduceTensorsWith). The zero value
// is NewFuser's behaviour with DefaultBucketBytes.
type FuserOptions struct {
	// BucketBytes bounds a bucket, counted in the tensors' own element size
	// (so a compressed bucket holds the same tensors and puts half of this on
	// the wire); 0 means DefaultBucketBytes.
	BucketBytes int
	// Wire is the element type the tensors travel and are reduced in: 0 (or
	// the tensors' own type) for none, Float16 or BFloat16 to halve the bytes
	// of float32 tensors. Reduction is in float32, rounding to Wire after each
	// combining step; Avg divides in float32 after the reduction.
	Wire DType
	// ErrorFeedback, with a 16-bit Wire, keeps what rounding each element lost
	// and adds it to the element's value in the next round, so the rounding
	// errors do not add up over steps. The residues (4 bytes per element) are
	// this rank's own and are lost with the Fuser.
	ErrorFeedback bool
	// Exact lists tensors that keep their own type when Wire is a 16-bit type
	// (counts, fingerprints, votes): each is then reduced alone, in place, as
	// a bucket of its own. Without a 16-bit Wire it changes nothing.
	Exact []int
}

// NewFuser lays tensors out into buckets of at most bucketBytes (0 means
// DefaultBucketBytes) and starts the Fuser's goroutine, whose allreduces run
// under ctx; Close stops it.
func NewFuser[T Float](ctx context.Context, g *Group, tensors [][]T, op ReduceOp, bucketBytes int) *Fuser[T] {
	f, err := NewFuserWith(ctx, g, tensors, op, FuserOptions{BucketBytes: bucketBytes})
	if err != nil { // no option that can be refused was given
		panic(err)
	}
	return f
}

// NewFuserWith is NewFuser with options: a compressed wire type, error
// feedback, tensors kept exact. It refuses a Wire other than 0, the tensors'
// type, Float16 or BFloat16, a 16-bit Wire for float64 tensors, error
// feedback without a 16-bit Wire, and an Exact index out of range.
func NewFuserWith[T Float](ctx context.Context, g *Group, tensors [][]T, op ReduceOp, o FuserOptions) (*Fuser[T], error) {
	bucketBytes := o.BucketBytes
	if bucketBytes <= 0 {
		bucketBytes = DefaultBucketBytes
	}
	var z T
	es := len(bytesOf([]T{z}))
	own := Float32
	if es == 8 {
		own = Float64
	}
	wire := o.Wire
	switch {
	case wire == own:
		wire = 0
	case wire == 0:
	case !wire.Half():
		return nil, fmt.Errorf("collective fuser: wire type %s for %s tensors (want %s, float16 or bfloat16)", wire, own, own)
	case own != Float32:
		return nil, fmt.Errorf("collective fuser: wire type %s needs float32 tensors, not %s", wire, own)
	}
	if o.ErrorFeedback && wire == 0 {
		return nil, fmt.Errorf("collective fuser: error feedback without a 16-bit wire type")
	}
	exact := make([]bool, len(tensors))
	for _, i := range o.Exact {
		if i < 0 || i >= len(tensors) {
			return nil, fmt.Errorf("collective fuser: exact tensor %d outside 0..%d", i, len(tensors)-1)
		}
		exact[i] = wire != 0
	}
	f := &Fuser[T]{ctx: ctx, g: g, op: op, wire: wire, tensors: tensors, where: make([]int, len(tensors)), launch: make(chan int, len(tensors)+1)}
	wireElems := 0
	for i := 0; i < len(tensors); {
		b := bucket[T]{first: i}
		size := 0
		for i < len(tensors) && (i == b.first || !exact[i] && !exact[b.first] && size+len(tensors[i])*es <= bucketBytes) {
			b.offs = append(b.offs, size/es)
			size += len(tensors[i]) * es
			f.where[i] = len(f.buckets)
			i++
		}
		b.last = i
		switch {
		case wire != 0 && !exact[b.first]:
			wireElems += size / es
		case b.last-b.first > 1:
			b.fused = make([]T, size/es)
		}
		f.buckets = append(f.buckets, b)
	}
	if wire != 0 { // one slab for every bucket's wire buffer, one for residues
		slab := make([]uint16, wireElems)
		at := 0
		for k := range f.buckets {
			b := &f.buckets[k]
			if exact[b.first] {
				continue
			}
			n := b.offs[len(b.offs)-1] + len(tensors[b.last-1])
			b.wire = slab[at : at+n : at+n]
			at += n
		}
		if o.ErrorFeedback {
			res := make([]float32, wireElems)
			f.resid = make([][]float32, len(tensors))
			at = 0
			for i, x := range tensors {
				if !exact[i] {
					f.resid[i] = res[at : at+len(x) : at+len(x)]
					at += len(x)
				}
			}
		}
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
	return f, nil
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
		switch {
		case b.wire != nil:
			op := f.op
			if op == Avg { // divided in float32 by WaitBucket
				op = Sum
			}
			err = f.g.AllReduce(f.ctx, Buffer{b: bytesOf(b.wire), dt: f.wire}, op)
		case b.fused == nil:
			err = f.g.AllReduce(f.ctx, Of(f.tensors[b.first]), f.op)
		default:
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
	switch {
	case b.wire != nil:
		x := f32s(bytesOf(f.tensors[i]))
		w := b.wire[b.offs[i-b.first]:][:len(x)]
		if f.resid != nil {
			encodeHalfFeedback(f.wire, w, x, f.resid[i])
		} else {
			encodeHalf(f.wire, w, x)
		}
	case b.fused != nil:
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
	switch {
	case b.wire != nil:
		div := float32(1)
		if f.op == Avg {
			div = float32(f.g.Size())
		}
		for i := b.first; i < b.last; i++ {
			x := f32s(bytesOf(f.tensors[i]))
			decodeHalf(f.wire, x, b.wire[b.offs[i-b.first]:][:len(x)], div)
		}
	case b.fused != nil:
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

// ClearResidues forgets the error-feedback residues (a no-op without error
// feedback): after a step is abandoned and redone, so the redone step does
// not carry the rounding residue of gradients that were never applied.
func (f *Fuser[T]) ClearResidues() {
	for _, r := range f.resid {
		clear(r)
	}
}

// Buckets is the number of buckets.
func (f *Fuser[T]) Buckets() int { return len(f.buckets) }

// Close stops the Fuser's goroutine.
func (f *Fuser[T]) Close() { close(f.launch) }

// AllReduceTensors reduces every tensor in place, fused into buckets of
// bucketBytes (0: DefaultBucketBytes).
func AllReduceTensors[T Float](ctx context.Context, g *Group, tensors [][]T, op ReduceOp, bucketBytes int) error {
	return AllReduceTensorsWith(ctx, g, tensors, op, FuserOptions{BucketBytes: bucketBytes})
}

// AllReduceTensorsWith is AllReduceTensors with a Fuser's options (a 16-bit
// wire type, tensors kept exact). Error feedback needs residues kept from
// call to call and is refused here: use a Fuser.
func AllReduceTensorsWith[T Float](ctx context.Context, g *Group, tensors [][]T, op ReduceOp, o FuserOptions) error {
	if o.ErrorFeedback {
		return fmt.Errorf("collective: error feedback needs a Fuser kept from step to step, not AllReduceTensors")
	}
	f, err := NewFuserWith(ctx, g, tensors, op, o)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := range tensors {
		if err := f.MarkReady(i); err != nil {
			return err
		}
	}
	return f.Wait(ctx)
}
