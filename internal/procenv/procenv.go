// Package procenv names the environment variables that place a launched
// process of a job on the network: its data-plane listen address and the
// address its peers dial. Only the chaos harness sets them (a worker in a
// network namespace of its own, behind a proxy); by default a worker
// listens on a loopback port and advertises that.
package procenv

const (
	// Bind is the data plane's listen address (host:port).
	Bind = "PHALANX_BIND"
	// Advertise is the address peers dial, when it is not Bind's.
	Advertise = "PHALANX_ADVERTISE"
)
