package collective

import (
	"errors"
	"fmt"
)

// Failure kinds. An operation's error wraps exactly one of them; errors.As to
// *OpError gives the rank it concerns.
var (
	// ErrPeerLost: a peer's connection reset or closed (its process died or it
	// closed the group).
	ErrPeerLost = errors.New("peer lost")
	// ErrTimeout: no progress before the operation's deadline; Rank is the peer
	// that went silent.
	ErrTimeout = errors.New("timed out")
	// ErrMismatch: ranks called different operations, lengths, dtypes or roots.
	ErrMismatch = errors.New("mismatched call across ranks")
	// ErrProtocol: a peer sent bytes that are not a valid frame for this group
	// (garbage, another protocol version, another job or generation).
	ErrProtocol = errors.New("protocol violation")
	// ErrAborted: the operation was cancelled by its context or by Abort.
	ErrAborted = errors.New("aborted")
	// ErrClosed: the group was closed.
	ErrClosed = errors.New("group closed")
)

// OpError is the error of a failed operation or connection.
type OpError struct {
	Op         string // "allreduce", "connect", ...
	Seq        uint64 // the operation's sequence number in the group (0 outside one)
	Rank       int    // the peer the failure concerns, -1 if none
	ReportedBy int    // the rank that detected it; differs from the local rank when relayed by an abort frame
	Kind       error  // one of the Err* kinds above
	Detail     string
	Err        error // underlying cause, if any
}

func (e *OpError) Error() string {
	s := fmt.Sprintf("collective %s", e.Op)
	if e.Seq != 0 {
		s += fmt.Sprintf(" #%d", e.Seq)
	}
	s += ": " + e.Kind.Error()
	if e.Rank >= 0 {
		s += fmt.Sprintf(": rank %d", e.Rank)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap exposes both the kind and the cause to errors.Is and errors.As.
func (e *OpError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

var wireKinds = []error{nil, ErrPeerLost, ErrTimeout, ErrMismatch, ErrProtocol, ErrAborted, ErrClosed}

func kindCode(k error) uint8 {
	for i, w := range wireKinds {
		if w != nil && w == k {
			return uint8(i)
		}
	}
	return uint8(len(wireKinds)) // unknown; decodes to ErrAborted
}

func kindOf(code uint8) error {
	if int(code) < len(wireKinds) && code != 0 {
		return wireKinds[code]
	}
	return ErrAborted
}
