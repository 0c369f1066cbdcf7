package chaos

import (
	"context"

	"github.com/phalanx-rt/phalanx"
)

// psConfigure makes a launch of a scenario's job.kind "ps" a
// parameter-server job.
func psConfigure(sc *Scenario, lc *phalanx.LaunchConfig) {}

// psVerdicts replace the ring invariants that do not fit a
// parameter-server job (2, 3, 4, 6) with its own.
func psVerdicts(ctx context.Context, ru *run, out, ref *Outcome) []Verdict { return nil }

// psKinds are the parameter-server faults.
func psKinds() []Kind { return nil }

// psScenarios are the built-in scenarios of parameter-server jobs.
func psScenarios() []Scenario { return nil }
