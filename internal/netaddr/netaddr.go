// Package netaddr is what a listener tells its peers to dial: a bind of
// every interface (0.0.0.0, ::, or no host) needs an address to
// advertise; a host alone takes the bound port, host:port (a proxy's) is
// kept. The data plane, the actor remote and the parameter server share it.
package netaddr

import (
	"fmt"
	"net"
	"strings"
)

// Unspecified says whether host (of a bind address) is every interface.
func Unspecified(host string) bool {
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return host == "" || ip != nil && ip.IsUnspecified()
}

// Check says whether a listener bound to bind can tell its peers where to
// dial: a bind of every interface needs advertise, a host (or host:port)
// that is not itself every interface.
func Check(bind, advertise string) error {
	host, _, err := net.SplitHostPort(bind)
	if err != nil {
		return fmt.Errorf("bind address %q: %w", bind, err)
	}
	if advertise != "" {
		h := advertise
		if ah, _, err := net.SplitHostPort(advertise); err == nil {
			h = ah
		}
		if Unspecified(h) {
			return fmt.Errorf("advertise address %q names no host peers can dial", advertise)
		}
		return nil
	}
	if Unspecified(host) {
		return fmt.Errorf("binding %s listens on every interface, and peers need one address to dial: pass --advertise HOST (this host's address as the other hosts reach it)", bind)
	}
	return nil
}

// Advertised is the address a listener bound at port advertises:
// advertise when it has a port, advertise's host with port when it is a
// host alone, "" when it is empty (the caller's bound address then).
func Advertised(advertise string, port int) string {
	if advertise == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(advertise); err == nil {
		return advertise
	}
	return net.JoinHostPort(strings.Trim(advertise, "[]"), fmt.Sprint(port))
}
