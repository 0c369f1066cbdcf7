//go:build !phalanx_plant

package plant

import "os"

// Enabled says whether this build can plant bugs.
const Enabled = false

// On says whether bug b is planted in this process: never, without the
// build tag phalanx_plant.
func On(Bug) bool { return false }

// Orphan does nothing without the build tag phalanx_plant.
func Orphan(...*os.File) error { return nil }
