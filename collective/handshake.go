package collective

import (
	"encoding/binary"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// A handshake message is magic u32 | protocol version u16 | body length u16 |
// protobuf body. The prefix stays the same in every version so that a peer of
// another version still gets a readable refusal.
const (
	handshakeMagic   uint32 = 0x53484850 // "PHHS"
	maxHandshakeBody int    = 4096
)

func writeHandshake(w io.Writer, m proto.Message) error {
	body, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	if len(body) > maxHandshakeBody {
		return fmt.Errorf("handshake body of %d bytes exceeds %d", len(body), maxHandshakeBody)
	}
	buf := make([]byte, 8+len(body))
	binary.LittleEndian.PutUint32(buf[0:], handshakeMagic)
	binary.LittleEndian.PutUint16(buf[4:], ProtocolVersion)
	binary.LittleEndian.PutUint16(buf[6:], uint16(len(body)))
	copy(buf[8:], body)
	_, err = w.Write(buf)
	return err
}

// readHandshake reads one handshake message into m and returns the version
// the peer announced. A body that does not parse is an error; a version other
// than ours is reported to the caller, which decides what to answer.
func readHandshake(r io.Reader, m proto.Message) (uint16, error) {
	var pre [8]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return 0, fmt.Errorf("reading handshake: %w", err)
	}
	if mg := binary.LittleEndian.Uint32(pre[0:]); mg != handshakeMagic {
		if pre[0] == 0x16 && pre[1] == 3 { // a TLS handshake record
			return 0, fmt.Errorf("bad handshake magic %#08x: a TLS peer, and this rank's data plane has no TLS configured", mg)
		}
		return 0, fmt.Errorf("bad handshake magic %#08x: not a phalanx peer", mg)
	}
	ver := binary.LittleEndian.Uint16(pre[4:])
	n := binary.LittleEndian.Uint16(pre[6:])
	if int(n) > maxHandshakeBody {
		return ver, fmt.Errorf("handshake body of %d bytes exceeds %d", n, maxHandshakeBody)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return ver, fmt.Errorf("reading handshake body: %w", err)
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return ver, fmt.Errorf("malformed handshake body: %w", err)
	}
	return ver, nil
}

func helloFor(m Membership, to int) *phalanxpb.Hello {
	return &phalanxpb.Hello{
		ProtocolVersion: ProtocolVersion,
		Job:             m.Job,
		Generation:      m.Generation,
		FromRank:        uint32(m.Rank),
		ToRank:          uint32(to),
		World:           uint32(m.World()),
	}
}
