//go:build !race

package phalanx_test

// raceEnabled: this test binary runs under the race detector.
const raceEnabled = false
