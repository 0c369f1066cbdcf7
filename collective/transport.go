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
	// Hosts optionally names each rank's host (HostIdentity), in rank order:
	// empty means unknown, every rank on a host of its own; otherwise it has one
	// entry per peer. TransportAuto uses shared memory between ranks whose
	// entries are equal.
	Hosts []string
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
	case len(m.Hosts) != 0 && len(m.Hosts) != len(m.Peers):
		return fmt.Errorf("collective: membership names %d hosts for %d peers", len(m.Hosts), len(m.Peers))
	}
	for r, h := range m.Hosts {
		if h == "" {
			return fmt.Errorf("collective: membership names no host for rank %d", r)
		}
	}
	return nil
}

// sameHost reports whether ranks a and b are known to share a host.
func (m Membership) sameHost(a, b int) bool {
	return len(m.Hosts) != 0 && m.Hosts[a] == m.Hosts[b]
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
