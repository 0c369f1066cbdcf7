// Package chaos runs seeded fault schedules against real Phalanx jobs and
// checks what must survive them.
//
// A Scenario is a job, a seed and a schedule of faults (SIGKILL, SIGSTOP,
// SIGTERM of a worker, every worker killed and the job relaunched on
// another world size, a damaged checkpoint, garbage on the data plane).
// Each fault has a trigger (a step, a random step in a range, or a time
// after the first step), a target (a rank, or a random one) and a
// duration. The same scenario and seed give the same schedule (Plan).
//
// A Runner launches the job through phalanx.Launch (worker processes of
// the calling program), fires each fault when its trigger does, and then
// checks the invariants against an undisturbed run of the same job: the
// job ends as it must, every sample is trained exactly once across every
// generation and resume, the ranks end bitwise identical, the model equals
// the undisturbed one (bitwise when the world and order allow, else within
// a tolerance), every checkpoint verifies and none was overwritten, nothing
// is left behind, and recovery stays within the scenario's bound. Each run
// is a Report: JSON, a terminal table (WriteSummary) and an HTML page
// (WriteHTML) with the timeline of faults and steps and the loss curve.
//
// Built-in scenarios are listed by Builtin; Soak draws faults at random
// for a duration. Users add fault kinds to the map DefaultKinds returns,
// and point a Runner at their own job with Registry and Configure.
package chaos
