package collective

import (
	"net"
	"os"

	"github.com/phalanx-rt/phalanx/internal/plant"
)

// unlinkMapped removes a segment file every peer has mapped (or never
// will); the planted bug LeakShm (see internal/plant) leaves it behind.
func unlinkMapped(path string) {
	if !plant.On(plant.LeakShm) {
		os.Remove(path)
	}
}

// plantLeakListener is the planted bug LeakPort: a forgotten child process
// inherits the data plane's listening socket, so the port accepts
// connections after the worker is gone.
func plantLeakListener(ln net.Listener) {
	if !plant.On(plant.LeakPort) {
		return
	}
	if tl, ok := ln.(*net.TCPListener); ok {
		if f, err := tl.File(); err == nil {
			plant.Orphan(f)
			f.Close()
		}
	}
}
