package collective

import (
	"context"
	"fmt"
	"net"
)

// Membership names one rank of one generation of a job's group.
type Membership struct {
	Job        string
	Generation uint64
	Rank       int
	// Peers holds every rank's data-plane address, in rank order; its length is
	// the world size. The in-process transport uses only its length.
	Peers []string
}

// World is the number of ranks.
func (m Membership) World() int { return len(m.Peers) }

func (m Membership) validate() error {
	switch {
	case m.Job == "":
		return fmt.Errorf("collective: membership has an empty job id")
	case len(m.Peers) == 0:
		return fmt.Errorf("collective: membership has no peers")
	case m.Rank < 0 || m.Rank >= len(m.Peers):
		return fmt.Errorf("collective: rank %d outside world of %d", m.Rank, len(m.Peers))
	case m.Generation == 0:
		return fmt.Errorf("collective: generation must be at least 1")
	}
	return nil
}

// Transport connects the ranks of one generation pairwise.
type Transport interface {
	// Connect returns one full-duplex connection per peer, indexed by rank (nil
	// at m.Rank), or an error naming the peer that could not be reached. It
	// blocks until every peer has connected or ctx ends.
	Connect(ctx context.Context, m Membership) ([]net.Conn, error)
}

type connKey struct {
	job      string
	gen      uint64
	from, to int
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}
