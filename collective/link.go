package collective

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// smallFrame is the largest payload copied next to its header and written in
// one call; larger ones are written from the caller's memory with writev.
const smallFrame = 32 << 10

// readPiece bounds one read of a large payload, so the peer's liveness is
// refreshed while it streams.
const readPiece = 4 << 20

type sendReq struct {
	h header
	p []byte
}

type recvReq struct {
	h header // what the frame must say
	p []byte // where its payload goes; len(p) is the expected length
}

// link is the connection to one peer: a goroutine that writes queued frames
// and heartbeats, and one that reads frames into queued buffers and watches for
// aborts, goodbyes and a dropped connection even between operations.
type link struct {
	g    *Group
	peer int
	conn net.Conn
	br   *bufio.Reader

	sendq chan sendReq
	sent  chan error
	recvq chan recvReq
	recvd chan error

	lastHeard atomic.Int64 // unix nanoseconds of the last frame read
	parked    atomic.Bool  // a data frame is read and waits for its operation
	peerBye   atomic.Bool

	// send goroutine only
	wbuf   []byte
	iov    [2][]byte // backing of bufs: WriteTo consumes the slice, not this
	bufs   net.Buffers
	broken bool // a write failed part-way: the stream is no longer framed

	// receive goroutine only
	rhdr   [headerSize]byte
	reason [maxReason]byte

	// operation goroutine only
	sendIdx, recvIdx       uint32
	pendSend, pendRecv     int
	p2pSendSeq, p2pRecvSeq uint64
}

func newLink(g *Group, peer int, c net.Conn) *link {
	l := &link{
		g:     g,
		peer:  peer,
		conn:  c,
		br:    bufio.NewReaderSize(c, 64<<10),
		sendq: make(chan sendReq, maxQueued),
		sent:  make(chan error, maxQueued),
		recvq: make(chan recvReq, maxQueued),
		recvd: make(chan error, maxQueued),
		wbuf:  make([]byte, headerSize+smallFrame),
	}
	l.lastHeard.Store(time.Now().UnixNano())
	return l
}

func (l *link) writeFrame(h *header, p []byte) error {
	h.encode(l.wbuf[:headerSize])
	var err error
	if tc, ok := l.conn.(*tlsConn); ok && len(p) > smallFrame {
		err = tc.writeBuffers(l.wbuf[:headerSize], p)
	} else if len(p) <= smallFrame {
		n := copy(l.wbuf[headerSize:], p)
		_, err = l.conn.Write(l.wbuf[:headerSize+n])
	} else {
		l.iov = [2][]byte{l.wbuf[:headerSize], p}
		l.bufs = l.iov[:]
		_, err = l.bufs.WriteTo(l.conn)
	}
	if err != nil {
		l.broken = true
	}
	return err
}

func (l *link) sendLoop() {
	g := l.g
	defer g.sendWG.Done()
	hb := time.NewTicker(g.opts.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case r := <-l.sendq:
			var err error
			if l.peerBye.Load() {
				err = g.fail(l.lost("send", "it closed its group", nil))
			} else if werr := l.writeFrame(&r.h, r.p); werr != nil {
				err = g.fail(l.lost("send", "", werr))
			}
			l.sent <- err
			if err != nil {
				return
			}
		case <-hb.C:
			if l.peerBye.Load() {
				continue
			}
			h := header{kind: kindHeartbeat, src: uint32(g.rank), gen: g.m.Generation, job: g.job}
			if err := l.writeFrame(&h, nil); err != nil {
				g.fail(l.lost("heartbeat", "", err))
				return
			}
		case <-g.dead:
			l.sendAbort()
			if cw, ok := l.conn.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite() // peers that missed the abort see the end of the stream
			}
			return
		case <-g.closing:
			if g.failure() == nil && !l.peerBye.Load() {
				h := header{kind: kindBye, src: uint32(g.rank), gen: g.m.Generation, job: g.job}
				l.conn.SetWriteDeadline(time.Now().Add(g.opts.CloseGrace))
				l.writeFrame(&h, nil)
			}
			if cw, ok := l.conn.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			return
		}
	}
}

// sendAbort tells the peer why this rank's group failed, unless the stream is
// broken or the failure is this very peer's connection.
func (l *link) sendAbort() {
	g := l.g
	var oe *OpError
	err := g.failure()
	if l.broken || l.peerBye.Load() || !errors.As(err, &oe) {
		return
	}
	if oe.Rank == l.peer && (oe.Kind == ErrPeerLost || oe.Kind == ErrProtocol) {
		return
	}
	if oe.Kind == ErrClosed {
		return
	}
	reason := err.Error()
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	blamed := noRank
	if oe.Rank >= 0 {
		blamed = uint32(oe.Rank)
	}
	h := header{kind: kindAbort, op: opCode(kindCode(oe.Kind)), src: uint32(g.rank), index: blamed,
		gen: g.m.Generation, seq: oe.Seq, job: g.job, length: uint32(len(reason))}
	l.writeFrame(&h, []byte(reason))
}

func (l *link) lost(op, detail string, err error) error {
	g := l.g
	if detail == "" {
		detail = "connection to rank " + fmt.Sprint(l.peer) + " failed"
	}
	return &OpError{Op: op, Seq: g.curSeq.Load(), Rank: l.peer, ReportedBy: g.rank, Kind: ErrPeerLost, Detail: detail, Err: err}
}

func (l *link) protocol(detail string, err error) error {
	g := l.g
	return &OpError{Op: "receive", Rank: l.peer, ReportedBy: g.rank, Kind: ErrProtocol,
		Detail: fmt.Sprintf("from rank %d (%s): %s", l.peer, l.conn.RemoteAddr(), detail), Err: err}
}

func (l *link) recvLoop() {
	g := l.g
	defer g.recvWG.Done()
	for {
		if _, err := io.ReadFull(l.br, l.rhdr[:]); err != nil {
			l.readFailed(err)
			return
		}
		h, err := decodeHeader(l.rhdr[:])
		if err != nil {
			g.fail(l.protocol("malformed frame", err))
			return
		}
		if err := l.checkOrigin(&h); err != nil {
			g.fail(err)
			return
		}
		l.lastHeard.Store(time.Now().UnixNano())
		switch h.kind {
		case kindHeartbeat:
		case kindBye: // the peer's last frame
			l.peerBye.Store(true)
			if g.fast != nil {
				g.fast.interrupt() // a fast-path wait on this peer must fail now
			}
			l.refuseAfterBye()
			return
		case kindAbort:
			l.readAbort(&h)
			return
		case kindData:
			if !l.deliver(&h) {
				return
			}
		}
	}
}

// checkOrigin refuses frames that are not from this link's peer in this job
// and generation.
func (l *link) checkOrigin(h *header) error {
	g := l.g
	switch {
	case h.job != g.job:
		return l.protocol(fmt.Sprintf("frame of another job (hash %#x, ours %#x)", h.job, g.job), nil)
	case h.gen != g.m.Generation:
		return l.protocol(fmt.Sprintf("frame of generation %d, the group is generation %d", h.gen, g.m.Generation), nil)
	case h.src != uint32(l.peer):
		return l.protocol(fmt.Sprintf("frame claims to come from rank %d", h.src), nil)
	}
	return nil
}

// deliver reads a data frame's payload into the buffer its operation queued,
// after checking the frame is the one that operation expects. It reports
// whether the loop should go on.
func (l *link) deliver(h *header) bool {
	g := l.g
	var req recvReq
	l.parked.Store(true)
	select {
	case req = <-l.recvq:
		l.parked.Store(false)
	case <-g.dead:
		return false
	case <-g.closing:
		_, err := io.CopyN(io.Discard, l.br, int64(h.length))
		return err == nil
	}
	if err := l.checkExpected(h, &req.h); err != nil {
		l.recvd <- g.fail(err)
		return false
	}
	for off := 0; off < len(req.p); {
		n := min(len(req.p)-off, readPiece)
		if _, err := io.ReadFull(l.br, req.p[off:off+n]); err != nil {
			l.readFailed(err)
			err := g.failure()
			if err == nil {
				err = g.fail(l.lost("receive", "", err))
			}
			l.recvd <- err
			return false
		}
		off += n
		l.lastHeard.Store(time.Now().UnixNano())
	}
	l.recvd <- nil
	return true
}

func (l *link) checkExpected(got, want *header) error {
	g := l.g
	name := want.op.String()
	switch {
	case got.op != want.op || got.seq != want.seq:
		return &OpError{Op: name, Seq: want.seq, Rank: l.peer, ReportedBy: g.rank, Kind: ErrMismatch,
			Detail: fmt.Sprintf("rank %d sent a frame of %s #%d while this rank runs %s #%d", l.peer, got.op, got.seq, name, want.seq)}
	case got.dtype != want.dtype:
		return &OpError{Op: name, Seq: want.seq, Rank: l.peer, ReportedBy: g.rank, Kind: ErrMismatch,
			Detail: fmt.Sprintf("rank %d sent %s elements, this rank has %s", l.peer, got.dtype, want.dtype)}
	case got.count != want.count:
		return &OpError{Op: name, Seq: want.seq, Rank: l.peer, ReportedBy: g.rank, Kind: ErrMismatch,
			Detail: fmt.Sprintf("rank %d called with %d elements, this rank with %d", l.peer, got.count, want.count)}
	case got.arg != want.arg:
		return &OpError{Op: name, Seq: want.seq, Rank: l.peer, ReportedBy: g.rank, Kind: ErrMismatch,
			Detail: fmt.Sprintf("rank %d called with %s, this rank with %s", l.peer, describeArg(want.op, got.arg), describeArg(want.op, want.arg))}
	case got.index != want.index || got.length != want.length:
		return &OpError{Op: name, Seq: want.seq, Rank: l.peer, ReportedBy: g.rank, Kind: ErrProtocol,
			Detail: fmt.Sprintf("rank %d sent frame %d of %d bytes, expected frame %d of %d bytes", l.peer, got.index, got.length, want.index, want.length)}
	}
	return nil
}

func (l *link) readAbort(h *header) {
	g := l.g
	reason := l.reason[:h.length]
	if _, err := io.ReadFull(l.br, reason); err != nil {
		l.readFailed(err)
		return
	}
	blamed := -1
	if h.index != noRank {
		blamed = int(h.index)
	}
	g.fail(&OpError{Op: "abort", Seq: h.seq, Rank: blamed, ReportedBy: l.peer, Kind: kindOf(uint8(h.op)),
		Detail: fmt.Sprintf("rank %d failed: %s", l.peer, reason)})
}

// readFailed turns a read error into the group's failure, unless it is the
// expected end of a closing or failed group or a peer that said goodbye.
func (l *link) readFailed(err error) {
	g := l.g
	select {
	case <-g.dead:
		return
	case <-g.closing:
		return
	default:
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return
	}
	if l.peerBye.Load() && errors.Is(err, io.EOF) {
		l.refuseAfterBye()
		return
	}
	detail := fmt.Sprintf("connection to rank %d (%s) lost", l.peer, l.conn.RemoteAddr())
	if errors.Is(err, io.ErrUnexpectedEOF) {
		detail = fmt.Sprintf("rank %d (%s) hung up mid-frame", l.peer, l.conn.RemoteAddr())
	}
	g.fail(l.lost("receive", detail, err))
}

// refuseAfterBye answers the receives of a peer that closed its group: the
// first one fails the group, since the peer will never send it.
func (l *link) refuseAfterBye() {
	g := l.g
	select {
	case <-l.recvq:
		l.recvd <- g.fail(l.lost("receive", fmt.Sprintf("rank %d closed its group", l.peer), nil))
	case <-g.dead:
	case <-g.closing:
	}
}
