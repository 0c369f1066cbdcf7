package collective

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Shared-memory segments. Every file is named for the job hash, the
// generation and a per-Connect nonce:
//
//	phalanx-<job hash>-g<gen>-r<rank>-<nonce>         a rank's segment (its fast-path slabs)
//	phalanx-<job hash>-g<gen>-p<lo>-<hi>-<nonce of lo> a pair's segment (two byte rings)
//
// and unlinked as soon as every peer has mapped it, so a crash leaves nothing
// behind; Connect also sweeps files of older generations of its job.
//
// A pair segment is one 4 KiB header page, one page holding the two rings'
// control words, then the lo→hi and the hi→lo data areas (RingBytes each). A
// rank segment is a header page, a control page (round counters, doorbell,
// two operation descriptors), then two slabs of SlabBytes each.
const (
	shmPage = 4096

	segKindPair uint8 = 1
	segKindRank uint8 = 2

	segMagic   uint32 = 0x4d534850 // "PHSM"
	helloMagic uint32 = 0x55534850 // "PHSU"
	ctrlSize          = 64

	// ring control block, one per direction; producer and consumer words on
	// different cache lines
	ringHead        = 0
	ringTail        = 64
	ringConsWaiting = 128
	ringProdClosed  = 132
	ringProdWaiting = 192
	ringConsClosed  = 196
	ringCtrlSize    = 256

	// rank control page; words written by different ranks on different
	// cache lines
	rankPosted = 0   // last step whose input is in the slab
	rankDone   = 64  // last step whose owned chunk is reduced
	rankRead   = 128 // last step this rank finished reading from every slab
	rankBell   = 192 // futex: this rank sleeps here
	rankSleep  = 200 // u64: what this rank sleeps for (shmWaitKind<<56 | target), 0 when awake
	rankDesc   = 256 // two operation descriptors, by step parity
	rankArrive = 512 // three u64 counters, 64 bytes apart, that peers add to (see shmWaitKind)
)

func pairSegmentSize(ring int) int { return 2*shmPage + 2*ring }
func rankSegmentSize(slab int) int { return 2*shmPage + 2*slab }

func segName(job, gen uint64) string { return fmt.Sprintf("phalanx-%016x-g%d-", job, gen) }

func rankSegName(job, gen uint64, rank int, nonce uint64) string {
	return fmt.Sprintf("%sr%d-%016x", segName(job, gen), rank, nonce)
}

func pairSegName(job, gen uint64, lo, hi int, nonce uint64) string {
	return fmt.Sprintf("%sp%d-%d-%016x", segName(job, gen), lo, hi, nonce)
}

// segHeader opens every segment, and (kind 0) is the hello two ranks exchange
// over TCP before upgrading their connection:
//
//	0 magic u32 | 4 version u8 | 5 kind u8 | 6 zero u16 | 8 job hash u64 | 16 generation u64
//	24 a u32 | 28 b u32 | 32 world u32 | 36 pid u32 | 40 ring bytes u32 | 44 slab bytes u32
//	48 nonce u64 | 56 reserved u32 (zero) | 60 crc32c of bytes 0..59
//
// For a pair segment a < b are its ranks; for a rank segment a is the rank;
// in a hello a is the sender and b the receiver.
type segHeader struct {
	kind       uint8
	job, gen   uint64
	a, b       uint32
	world, pid uint32
	ring, slab uint32
	nonce      uint64
}

func (h *segHeader) encode(b []byte, magic uint32) {
	_ = b[ctrlSize-1]
	binary.LittleEndian.PutUint32(b[0:], magic)
	b[4] = ProtocolVersion
	b[5] = h.kind
	binary.LittleEndian.PutUint16(b[6:], 0)
	binary.LittleEndian.PutUint64(b[8:], h.job)
	binary.LittleEndian.PutUint64(b[16:], h.gen)
	binary.LittleEndian.PutUint32(b[24:], h.a)
	binary.LittleEndian.PutUint32(b[28:], h.b)
	binary.LittleEndian.PutUint32(b[32:], h.world)
	binary.LittleEndian.PutUint32(b[36:], h.pid)
	binary.LittleEndian.PutUint32(b[40:], h.ring)
	binary.LittleEndian.PutUint32(b[44:], h.slab)
	binary.LittleEndian.PutUint64(b[48:], h.nonce)
	binary.LittleEndian.PutUint32(b[56:], 0)
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
}

// decodeSegHeader parses a segment header or hello and checks what does not
// depend on the reader: magic, version, checksum.
func decodeSegHeader(b []byte, magic uint32) (segHeader, error) {
	var h segHeader
	if len(b) < ctrlSize {
		return h, fmt.Errorf("truncated shared-memory header: %d of %d bytes", len(b), ctrlSize)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != magic {
		return h, fmt.Errorf("bad shared-memory magic %#08x, want %#08x", m, magic)
	}
	if v := b[4]; v != ProtocolVersion {
		return h, fmt.Errorf("shared-memory header of protocol version %d, this rank speaks %d", v, ProtocolVersion)
	}
	if want, got := crc32.Checksum(b[:60], castagnoli), binary.LittleEndian.Uint32(b[60:]); want != got {
		return h, fmt.Errorf("shared-memory header checksum %#08x, computed %#08x", got, want)
	}
	if binary.LittleEndian.Uint16(b[6:]) != 0 || binary.LittleEndian.Uint32(b[56:]) != 0 {
		return h, fmt.Errorf("reserved shared-memory header fields are not zero")
	}
	h = segHeader{
		kind:  b[5],
		job:   binary.LittleEndian.Uint64(b[8:]),
		gen:   binary.LittleEndian.Uint64(b[16:]),
		a:     binary.LittleEndian.Uint32(b[24:]),
		b:     binary.LittleEndian.Uint32(b[28:]),
		world: binary.LittleEndian.Uint32(b[32:]),
		pid:   binary.LittleEndian.Uint32(b[36:]),
		ring:  binary.LittleEndian.Uint32(b[40:]),
		slab:  binary.LittleEndian.Uint32(b[44:]),
		nonce: binary.LittleEndian.Uint64(b[48:]),
	}
	return h, nil
}

// expect refuses a header that is not the one want describes (pid and, when
// want.nonce is zero, nonce are not compared).
func (h segHeader) expect(want segHeader) error {
	switch {
	case h.job != want.job:
		return fmt.Errorf("shared-memory header of another job (hash %#x, ours %#x)", h.job, want.job)
	case h.gen != want.gen:
		return fmt.Errorf("shared-memory header of generation %d, ours is %d", h.gen, want.gen)
	case h.kind != want.kind:
		return fmt.Errorf("shared-memory header of kind %d, want %d", h.kind, want.kind)
	case h.a != want.a || h.b != want.b:
		return fmt.Errorf("shared-memory header for ranks %d,%d, want %d,%d", h.a, h.b, want.a, want.b)
	case h.world != want.world:
		return fmt.Errorf("shared-memory header for a world of %d, ours has %d", h.world, want.world)
	case h.ring != want.ring || h.slab != want.slab:
		return fmt.Errorf("shared-memory sizes ring %d slab %d, ours ring %d slab %d", h.ring, h.slab, want.ring, want.slab)
	case want.nonce != 0 && h.nonce != want.nonce:
		return fmt.Errorf("shared-memory segment nonce %#x, want %#x", h.nonce, want.nonce)
	}
	return nil
}

// opDesc says which operation and step a rank's slab holds; peers check it
// before reading the slab:
//
//	0 job hash u64 | 8 generation u64 | 16 seq u64 | 24 step u64 | 32 count u64
//	40 offset u64 (first element of this step) | 48 dtype u8 | 49 zero u8×3 | 52 arg u32
//	56 reserved u32 (zero) | 60 crc32c of bytes 0..59
type opDesc struct {
	job, gen, seq, step, count, offset uint64
	dtype                              DType
	arg                                uint32
}

func (d *opDesc) encode(b []byte) {
	_ = b[ctrlSize-1]
	binary.LittleEndian.PutUint64(b[0:], d.job)
	binary.LittleEndian.PutUint64(b[8:], d.gen)
	binary.LittleEndian.PutUint64(b[16:], d.seq)
	binary.LittleEndian.PutUint64(b[24:], d.step)
	binary.LittleEndian.PutUint64(b[32:], d.count)
	binary.LittleEndian.PutUint64(b[40:], d.offset)
	binary.LittleEndian.PutUint32(b[48:], uint32(d.dtype))
	binary.LittleEndian.PutUint32(b[52:], d.arg)
	binary.LittleEndian.PutUint32(b[56:], 0)
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
}

func decodeOpDesc(b []byte) (opDesc, error) {
	var d opDesc
	if len(b) < ctrlSize {
		return d, fmt.Errorf("truncated operation descriptor: %d of %d bytes", len(b), ctrlSize)
	}
	if want, got := crc32.Checksum(b[:60], castagnoli), binary.LittleEndian.Uint32(b[60:]); want != got {
		return d, fmt.Errorf("operation descriptor checksum %#08x, computed %#08x", got, want)
	}
	if binary.LittleEndian.Uint32(b[56:]) != 0 || binary.LittleEndian.Uint32(b[48:])>>8 != 0 {
		return d, fmt.Errorf("reserved operation descriptor fields are not zero")
	}
	d = opDesc{
		job:    binary.LittleEndian.Uint64(b[0:]),
		gen:    binary.LittleEndian.Uint64(b[8:]),
		seq:    binary.LittleEndian.Uint64(b[16:]),
		step:   binary.LittleEndian.Uint64(b[24:]),
		count:  binary.LittleEndian.Uint64(b[32:]),
		offset: binary.LittleEndian.Uint64(b[40:]),
		dtype:  DType(b[48]),
		arg:    binary.LittleEndian.Uint32(b[52:]),
	}
	return d, nil
}

// check compares a peer's descriptor with ours: a foreign job or
// generation, another step, or an algorithm id this rank does not know is a
// protocol error; another operation or call a mismatch. It returns a
// description and the failure kind, or a nil kind.
func (d opDesc) check(want opDesc) (string, error) {
	switch {
	case d.job != want.job:
		return fmt.Sprintf("slab of another job (hash %#x, ours %#x)", d.job, want.job), ErrProtocol
	case d.gen != want.gen:
		return fmt.Sprintf("slab of generation %d, the group is generation %d", d.gen, want.gen), ErrProtocol
	case d.seq != want.seq:
		return fmt.Sprintf("slab of operation #%d while this rank runs #%d", d.seq, want.seq), ErrMismatch
	case d.count != want.count || d.dtype != want.dtype:
		return fmt.Sprintf("called with %d %s elements, this rank with %d %s", d.count, d.dtype, want.count, want.dtype), ErrMismatch
	case d.arg != want.arg && !argAlgorithm(d.arg).onWire():
		return "slab of an allreduce via " + unknownAlgorithm(argAlgorithm(d.arg)), ErrProtocol
	case d.arg != want.arg:
		return fmt.Sprintf("called with %s, this rank with %s", describeArg(opAllReduce, d.arg), describeArg(opAllReduce, want.arg)), ErrMismatch
	case d.step != want.step || d.offset != want.offset:
		return fmt.Sprintf("slab of step %d at element %d, expected step %d at element %d", d.step, d.offset, want.step, want.offset), ErrProtocol
	}
	return "", nil
}
