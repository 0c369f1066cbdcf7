package collective

import (
	"fmt"
	"strings"
)

// TransportKind chooses how the ranks of a group reach each other.
type TransportKind uint8

// Transport kinds.
const (
	// TransportAuto uses shared memory between ranks whose Membership.Hosts
	// match and TCP between the others; with no Hosts every pair uses TCP.
	TransportAuto TransportKind = iota
	// TransportTCP uses TCP between every pair.
	TransportTCP
	// TransportShm uses shared memory between every pair; the ranks must all
	// be on one host (Hosts, if given, all equal).
	TransportShm
)

var transportNames = []string{TransportAuto: "auto", TransportTCP: "tcp", TransportShm: "shm"}

func (k TransportKind) String() string {
	if int(k) < len(transportNames) {
		return transportNames[k]
	}
	return fmt.Sprintf("transport(%d)", uint8(k))
}

// ParseTransportKind accepts "auto", "tcp" and "shm".
func ParseTransportKind(s string) (TransportKind, error) {
	for k, name := range transportNames {
		if s == name {
			return TransportKind(k), nil
		}
	}
	return 0, fmt.Errorf("collective: unknown transport %q (want %s)", s, strings.Join(transportNames, ", "))
}
