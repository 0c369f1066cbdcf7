package ps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unsafe"
)

// Op is what a frame asks for or answers.
type Op uint8

// Operations of the data plane.
const (
	// OpPull asks for the rows of Keys (answered with their values).
	OpPull Op = iota + 1
	// OpPush sends the gradients of Keys' rows for Clock (answered with an
	// empty frame once every replica has applied it). Under bsp, ssp and
	// hybrid every worker pushes to every shard once per clock, with no
	// keys when its batch touched none of the shard's.
	OpPush
	// OpReplicate carries a state change from a shard's primary to a
	// backup, in the primary's order: a push as the primary took it
	// (Worker, ID and Clock of its origin), or with FlagClose the
	// primary's decision that Clock closed (hybrid, at its deadline).
	OpReplicate
	// OpInfo asks for a shard's state (answered with Clock and, in Keys,
	// the row count, then per worker the last applied id, the pushes taken
	// and the duplicates refused, then the clocks' base).
	OpInfo
	// OpRows asks for every row of a table in a shard, for checkpoints and
	// tests (answered with Keys and Values).
	OpRows
)

func (o Op) String() string {
	switch o {
	case OpPull:
		return "pull"
	case OpPush:
		return "push"
	case OpReplicate:
		return "replicate"
	case OpInfo:
		return "info"
	case OpRows:
		return "rows"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// carriesValues reports whether the frames of o hold Dim values per key
// (a request with values, or the answer to one that asks for them).
func (o Op) carriesValues(response bool) bool {
	switch o {
	case OpPush, OpReplicate:
		return !response
	case OpPull, OpRows:
		return response
	}
	return false
}

// Flags qualify a frame.
type Flags uint16

const (
	// FlagResponse marks an answer.
	FlagResponse Flags = 1 << iota
	// FlagClose marks a replicated decision to close a clock.
	FlagClose
	// FlagStale marks a push answered as stale: its clock had closed and
	// it was dropped or decayed (hybrid).
	FlagStale
	// FlagDuplicate marks a push answered as a duplicate: the shard had
	// applied this worker's push of that id already (a retry, or a share's
	// step replayed by the worker that took it over) and ignored it.
	FlagDuplicate
)

// Status is an answer's outcome.
type Status uint8

// Statuses of answers; an error's message is the body.
const (
	StatusOK Status = iota
	// StatusNotPrimary: this server does not own the shard as primary (the
	// shard map changed): refresh it and retry.
	StatusNotPrimary
	// StatusBadRequest: the request was malformed or invalid.
	StatusBadRequest
	// StatusUnavailable: the shard cannot serve now (a backup is down,
	// the server is stopping): retry.
	StatusUnavailable
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusNotPrimary:
		return "not primary"
	case StatusBadRequest:
		return "bad request"
	case StatusUnavailable:
		return "unavailable"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// frameMagic opens every frame: "PSv1" little-endian.
const frameMagic uint32 = 0x31765350

const (
	headerSize = 56
	// MaxFrameBody bounds a frame's body: a peer announcing more is
	// speaking garbage (1 GiB holds 4M rows of 64 float32s).
	MaxFrameBody = 1 << 30
	// MaxDim bounds a row's width.
	MaxDim     = 1 << 16
	maxMessage = 1 << 16
	// frameReadChunk is how much of an announced body ReadFrame reserves
	// before any of it arrived; past it the buffer grows as bytes come.
	frameReadChunk = 1 << 20
)

// Header is a frame's fixed part.
type Header struct {
	Op     Op
	Status Status
	Flags  Flags
	// ID is a push's id: a worker's pushes to a shard's table carry
	// increasing ids, so that a push retried after a failover is applied
	// once.
	ID     uint64
	Shard  uint32
	Table  uint32
	Clock  int64
	Worker uint32
	Count  uint32 // keys
	Dim    uint32 // floats per row, when the frame carries values
	// Seq matches an answer to its request on a connection (echoed); on
	// OpReplicate it is the change's place in the primary's order.
	Seq uint64
}

// Frame is a decoded frame. Keys and Values view the body buffer given to
// ReadFrame and are valid until it is reused.
type Frame struct {
	Header
	Keys   []uint64
	Values []float32
	// Message is an error answer's text.
	Message string
}

// FrameError is a malformed frame: the connection it came on cannot be
// trusted further.
type FrameError struct{ Reason string }

func (e *FrameError) Error() string { return "ps: malformed frame: " + e.Reason }

func frameErr(format string, a ...any) error { return &FrameError{Reason: fmt.Sprintf(format, a...)} }

// bodyLen is the body length a header implies (-1 for an error answer,
// whose body is its message).
func (h *Header) bodyLen() int {
	if h.Flags&FlagResponse != 0 && h.Status != StatusOK {
		return -1
	}
	n := int(h.Count) * 8
	if h.Op.carriesValues(h.Flags&FlagResponse != 0) {
		n += int(h.Count) * int(h.Dim) * 4
	}
	return n
}

func (h *Header) put(b []byte, body int) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], frameMagic)
	b[4], b[5] = byte(h.Op), byte(h.Status)
	le.PutUint16(b[6:], uint16(h.Flags))
	le.PutUint64(b[8:], h.ID)
	le.PutUint32(b[16:], h.Shard)
	le.PutUint32(b[20:], h.Table)
	le.PutUint64(b[24:], uint64(h.Clock))
	le.PutUint32(b[32:], h.Worker)
	le.PutUint32(b[36:], h.Count)
	le.PutUint32(b[40:], h.Dim)
	le.PutUint32(b[44:], uint32(body))
	le.PutUint64(b[48:], h.Seq)
}

// parseHeader checks a header and returns it with its body length.
func parseHeader(b []byte) (Header, int, error) {
	le := binary.LittleEndian
	if m := le.Uint32(b[0:]); m != frameMagic {
		return Header{}, 0, frameErr("magic %#08x, want %#08x (not a Phalanx parameter-server peer?)", m, frameMagic)
	}
	h := Header{Op: Op(b[4]), Status: Status(b[5]), Flags: Flags(le.Uint16(b[6:])), ID: le.Uint64(b[8:]),
		Shard: le.Uint32(b[16:]), Table: le.Uint32(b[20:]), Clock: int64(le.Uint64(b[24:])), Worker: le.Uint32(b[32:]),
		Count: le.Uint32(b[36:]), Dim: le.Uint32(b[40:]), Seq: le.Uint64(b[48:])}
	body := int(le.Uint32(b[44:]))
	switch {
	case h.Op < OpPull || h.Op > OpRows:
		return h, 0, frameErr("unknown op %d", uint8(h.Op))
	case h.Flags&^(FlagResponse|FlagClose|FlagStale|FlagDuplicate) != 0:
		return h, 0, frameErr("unknown flags %#x", uint16(h.Flags))
	case h.Status > StatusUnavailable:
		return h, 0, frameErr("unknown status %d", uint8(h.Status))
	case h.Status != StatusOK && h.Flags&FlagResponse == 0:
		return h, 0, frameErr("a request with status %v", h.Status)
	case h.Dim > MaxDim:
		return h, 0, frameErr("row width %d above %d", h.Dim, MaxDim)
	case body > MaxFrameBody:
		return h, 0, frameErr("body of %d bytes above %d", body, MaxFrameBody)
	}
	if h.bodyLen() < 0 {
		switch {
		case body > maxMessage:
			return h, 0, frameErr("error message of %d bytes above %d", body, maxMessage)
		case h.Count != 0 || h.Dim != 0:
			return h, 0, frameErr("an error answer with keys or rows")
		}
	}
	if want := h.bodyLen(); want >= 0 && want != body {
		return h, 0, frameErr("%v of %d keys × %d floats: body of %d bytes, want %d", h.Op, h.Count, h.Dim, body, want)
	}
	if h.Flags&FlagClose != 0 && (h.Op != OpReplicate || h.Count != 0) {
		return h, 0, frameErr("a clock close on a %v frame with %d keys", h.Op, h.Count)
	}
	return h, body, nil
}

// Buffer is a reusable body buffer, 8-byte aligned so that keys can be
// viewed in place.
type Buffer struct{ words []uint64 }

// capacity is how many bytes the buffer holds without growing.
func (b *Buffer) capacity() int { return 8 * cap(b.words) }

// grow returns the buffer grown to n bytes, keeping its first keep bytes.
func (b *Buffer) grow(n, keep int) []byte {
	if w := (n + 7) / 8; cap(b.words) < w {
		words := make([]uint64, w, w+w/4)
		copy(words, b.words[:(keep+7)/8])
		b.words = words
	}
	return b.bytes(n)
}

// bytes returns the buffer grown to n bytes.
func (b *Buffer) bytes(n int) []byte {
	w := (n + 7) / 8
	if cap(b.words) < w {
		b.words = make([]uint64, w, w+w/4)
	}
	b.words = b.words[:w]
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b.words))), w*8)[:n]
}

// ReadFrame reads one frame from r into buf (reused; the frame's Keys and
// Values view it). A malformed frame is a *FrameError.
func ReadFrame(r io.Reader, hdr *[headerSize]byte, buf *Buffer) (Frame, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	h, n, err := parseHeader(hdr[:])
	if err != nil {
		return Frame{}, err
	}
	// A header may announce up to MaxFrameBody: reserve it only as the
	// body arrives (doubling), so that a peer speaking garbage costs what
	// it sent, not a gigabyte per connection.
	body := buf.bytes(min(n, max(buf.capacity(), frameReadChunk)))
	for got := 0; got < n; got = len(body) {
		body = buf.grow(min(n, max(2*got, len(body))), got)
		if _, err := io.ReadFull(r, body[got:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, fmt.Errorf("ps: reading a %v frame's body of %d bytes: %w", h.Op, n, err)
		}
	}
	return decodeBody(h, body)
}

// DecodeFrame decodes a whole frame held in b (the fuzzed entry point; it
// copies nothing but the error message).
func DecodeFrame(b []byte, buf *Buffer) (Frame, error) {
	if len(b) < headerSize {
		return Frame{}, frameErr("%d bytes, shorter than a header", len(b))
	}
	h, n, err := parseHeader(b[:headerSize])
	if err != nil {
		return Frame{}, err
	}
	if len(b)-headerSize != n {
		return Frame{}, frameErr("%d body bytes, the header says %d", len(b)-headerSize, n)
	}
	body := buf.bytes(n)
	copy(body, b[headerSize:])
	return decodeBody(h, body)
}

func decodeBody(h Header, body []byte) (Frame, error) {
	f := Frame{Header: h}
	if h.bodyLen() < 0 {
		f.Message = string(body)
		return f, nil
	}
	k := int(h.Count) * 8
	if h.Count > 0 {
		f.Keys = unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(body))), h.Count)
	}
	if len(body) > k {
		f.Values = unsafe.Slice((*float32)(unsafe.Pointer(&body[k])), (len(body)-k)/4)
	}
	return f, nil
}

// Writer writes frames, reusing its header buffer. It is not safe for
// concurrent use.
type Writer struct {
	w   io.Writer
	hdr [headerSize]byte
}

// NewWriter writes frames to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes a frame of h with keys and values (len(values) must be
// len(keys) × h.Dim when the frame carries values, else 0). Count is set
// from keys.
func (w *Writer) Write(h Header, keys []uint64, values []float32) error {
	h.Count = uint32(len(keys))
	if h.Op.carriesValues(h.Flags&FlagResponse != 0) {
		if len(values) != len(keys)*int(h.Dim) {
			return fmt.Errorf("ps: %v frame of %d keys × %d floats with %d values", h.Op, len(keys), h.Dim, len(values))
		}
	} else if len(values) != 0 {
		return fmt.Errorf("ps: %v frame does not carry values", h.Op)
	}
	n := h.bodyLen()
	if n > MaxFrameBody {
		return fmt.Errorf("ps: %v frame of %d bytes above the limit of %d: split the request", h.Op, n, MaxFrameBody)
	}
	h.put(w.hdr[:], n)
	if _, err := w.w.Write(w.hdr[:]); err != nil {
		return err
	}
	if len(keys) > 0 {
		if _, err := w.w.Write(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(keys))), len(keys)*8)); err != nil {
			return err
		}
	}
	if len(values) > 0 {
		if _, err := w.w.Write(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(values))), len(values)*4)); err != nil {
			return err
		}
	}
	return nil
}

// WriteError writes an error answer to the request h.
func (w *Writer) WriteError(h Header, st Status, msg string) error {
	h.Flags |= FlagResponse
	h.Status, h.Count, h.Dim = st, 0, 0
	h.Flags &^= FlagClose
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	h.put(w.hdr[:], len(msg))
	if _, err := w.w.Write(w.hdr[:]); err != nil {
		return err
	}
	_, err := io.WriteString(w.w, msg)
	return err
}
