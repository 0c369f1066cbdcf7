//go:build !race

package ring

// raceEnabled: this test binary runs under the race detector.
const raceEnabled = false
