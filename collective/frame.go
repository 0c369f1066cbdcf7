package collective

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"hash/fnv"
)

// ProtocolVersion is the data-plane wire version, checked in the handshake and
// in every frame header.
const ProtocolVersion = 1

const (
	frameMagic  uint32 = 0x584c4850 // "PHLX" little-endian
	headerSize         = 64
	maxFrameLen        = 1 << 30 // one frame's payload; large tensors travel as many segments
	maxReason          = 1024    // abort reasons are truncated to this
	noRank             = ^uint32(0)
)

type frameKind uint8

const (
	kindData frameKind = iota + 1
	kindHeartbeat
	kindAbort // the sender's group failed; payload is the reason
	kindBye   // the sender closed its group gracefully
)

type opCode uint8

const (
	opAllReduce opCode = iota + 1
	opReduceScatter
	opAllGather
	opBroadcast
	opBarrier
	opSendRecv
	opAllToAll
)

func (o opCode) String() string {
	switch o {
	case opAllReduce:
		return "allreduce"
	case opReduceScatter:
		return "reduce-scatter"
	case opAllGather:
		return "allgather"
	case opBroadcast:
		return "broadcast"
	case opBarrier:
		return "barrier"
	case opSendRecv:
		return "send/recv"
	case opAllToAll:
		return "all-to-all"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// header is the fixed 64-byte prefix of every frame (little-endian):
//
//	0 magic u32 | 4 version u8 | 5 kind u8 | 6 op u8 | 7 dtype u8 | 8 src u32 | 12 index u32
//	16 generation u64 | 24 seq u64 | 32 job hash u64 | 40 count u64 | 48 length u32
//	52 arg u32 | 56 reserved u32 (zero) | 60 crc32c of bytes 0..59 u32
//
// index numbers the frames of one operation on one directed link; count is the
// element count the sender was called with and arg an operation-specific value
// (the reduction and the algorithm that runs, see allreduceArg; the broadcast
// root), so calls that disagree across ranks are caught at the first frame. In
// an abort frame, op carries the failure kind and index the rank the failure
// concerns.
type header struct {
	kind   frameKind
	op     opCode
	dtype  DType
	src    uint32
	index  uint32
	gen    uint64
	seq    uint64
	job    uint64
	count  uint64
	length uint32
	arg    uint32
}

func (h *header) encode(b []byte) {
	_ = b[headerSize-1]
	binary.LittleEndian.PutUint32(b[0:], frameMagic)
	b[4] = ProtocolVersion
	b[5] = byte(h.kind)
	b[6] = byte(h.op)
	b[7] = byte(h.dtype)
	binary.LittleEndian.PutUint32(b[8:], h.src)
	binary.LittleEndian.PutUint32(b[12:], h.index)
	binary.LittleEndian.PutUint64(b[16:], h.gen)
	binary.LittleEndian.PutUint64(b[24:], h.seq)
	binary.LittleEndian.PutUint64(b[32:], h.job)
	binary.LittleEndian.PutUint64(b[40:], h.count)
	binary.LittleEndian.PutUint32(b[48:], h.length)
	binary.LittleEndian.PutUint32(b[52:], h.arg)
	binary.LittleEndian.PutUint32(b[56:], 0)
	binary.LittleEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// decodeHeader parses and checks the parts of a header that do not depend on
// what the receiver expects: magic, version, checksum, kind and bounds.
func decodeHeader(b []byte) (header, error) {
	var h header
	if len(b) < headerSize {
		return h, fmt.Errorf("truncated header: %d of %d bytes", len(b), headerSize)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != frameMagic {
		return h, fmt.Errorf("bad frame magic %#08x: not a phalanx data-plane stream", m)
	}
	if v := b[4]; v != ProtocolVersion {
		return h, fmt.Errorf("frame of protocol version %d, this rank speaks %d", v, ProtocolVersion)
	}
	if want, got := crc32.Checksum(b[:60], castagnoli), binary.LittleEndian.Uint32(b[60:]); want != got {
		return h, fmt.Errorf("frame header checksum %#08x, computed %#08x: corrupt stream", got, want)
	}
	h = header{
		kind:   frameKind(b[5]),
		op:     opCode(b[6]),
		dtype:  DType(b[7]),
		src:    binary.LittleEndian.Uint32(b[8:]),
		index:  binary.LittleEndian.Uint32(b[12:]),
		gen:    binary.LittleEndian.Uint64(b[16:]),
		seq:    binary.LittleEndian.Uint64(b[24:]),
		job:    binary.LittleEndian.Uint64(b[32:]),
		count:  binary.LittleEndian.Uint64(b[40:]),
		length: binary.LittleEndian.Uint32(b[48:]),
		arg:    binary.LittleEndian.Uint32(b[52:]),
	}
	if r := binary.LittleEndian.Uint32(b[56:]); r != 0 {
		return h, fmt.Errorf("reserved header field is %#x, want 0", r)
	}
	switch h.kind {
	case kindData:
		if h.length > maxFrameLen {
			return h, fmt.Errorf("frame payload of %d bytes exceeds the %d-byte limit", h.length, maxFrameLen)
		}
		if h.op < opAllReduce || h.op > opAllToAll {
			return h, fmt.Errorf("unknown operation code %d", h.op)
		}
		if !h.dtype.valid() {
			return h, fmt.Errorf("unknown dtype code %d", h.dtype)
		}
		if a := argAlgorithm(h.arg); (h.op == opAllReduce || h.op == opReduceScatter) && !a.onWire() {
			return h, fmt.Errorf("%s frame: %s", h.op, unknownAlgorithm(a))
		}
	case kindHeartbeat, kindBye:
		if h.length != 0 {
			return h, fmt.Errorf("%s frame with a %d-byte payload", h.kind, h.length)
		}
	case kindAbort:
		if h.length > maxReason {
			return h, fmt.Errorf("abort reason of %d bytes exceeds %d", h.length, maxReason)
		}
	default:
		return h, fmt.Errorf("unknown frame kind %d", h.kind)
	}
	return h, nil
}

func (k frameKind) String() string {
	switch k {
	case kindData:
		return "data"
	case kindHeartbeat:
		return "heartbeat"
	case kindAbort:
		return "abort"
	case kindBye:
		return "bye"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// JobHash is the 64-bit FNV-1a hash of a job id, as carried in frame headers.
func JobHash(job string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(job))
	return h.Sum64()
}
