package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/internal/sockowner"
)

// check builds the run's report and checks every invariant.
func (ru *run) check(ctx context.Context, out, ref *Outcome, seed uint64) *Report {
	sc := ru.sc
	rep := &Report{Scenario: sc.Name, Description: sc.Description, Seed: seed, Started: ru.start,
		DurationS: ru.r.now().Sub(ru.start).Seconds(), Plan: ru.plan, Faults: ru.faults, Launches: out.Launches,
		Events: out.Events, RefEvents: ref.Events}
	if out.Err != nil {
		rep.Error = out.Err.Error()
	}
	if out.Result != nil {
		rep.Step, rep.Accuracy, rep.ParametersCRC = out.Result.Step, out.Result.Accuracy, out.Result.ParametersCRC
	}
	rep.RefAccuracy, rep.RefCRC = ref.Result.Accuracy, ref.Result.ParametersCRC
	rep.timeline(out.Events, ru.start)
	bound := time.Duration(sc.RecoveryBound)
	if bound == 0 {
		bound = time.Minute
	}
	rep.RecoveryBoundS = bound.Seconds()

	rep.Invariants = []Verdict{
		ru.checkSchedule(out),
		ru.checkEnd(out),
		ru.checkSamples(out.Events),
		checkIdentical(out.Events),
		ru.checkReference(out, ref),
		ru.checkCheckpoints(ctx),
		notApplicable(6, "a ring job has no parameter server"),
		func() Verdict { ru.closeServices(); return ru.checkLeftovers(out.Events) }(), // services serve invariant 5 first
		ru.checkRecovery(rep, bound),
	}
	if sc.Job.Kind == "ps" {
		for _, v := range psVerdicts(ctx, ru, out, ref) {
			rep.Invariants[v.N] = v
		}
		for _, f := range ru.faults {
			rep.RecoveryMaxS = max(rep.RecoveryMaxS, f.RecoveryS)
		}
		if out.Result != nil {
			rep.Accuracy = out.Result.Metrics["auc"] // a parameter-server model's measure
		}
		rep.RefAccuracy = ref.Result.Metrics["auc"]
	}
	na := ru.sc.inapplicable(ru.kinds)
	for n, why := range ru.unchecked { // what the job's kind says its events leave nothing to check
		rep.Invariants[n], na[n] = notApplicable(n, why), why
	}
	requireApplicable(rep.Invariants, na)
	rep.Passed = true
	for _, v := range rep.Invariants {
		if v.Status == "fail" {
			rep.Passed = false
		}
	}
	return rep
}

func (r *Report) timeline(evs []Event, start time.Time) {
	launch := 0
	for _, e := range evs {
		t := e.At.Sub(start).Seconds()
		switch e.Kind {
		case "job_started":
			launch++
		case "step":
			loss, _ := e.Fields["loss"].(float64)
			r.Steps = append(r.Steps, StepPoint{T: t, Step: e.num("step"), Loss: loss, World: e.num("world"),
				Generation: e.num("generation"), Launch: launch})
		case "generation":
			reason, _ := e.Fields["reason"].(string)
			by, _ := e.Fields["decided_by"].(string)
			r.Generations = append(r.Generations, GenPoint{T: t, Generation: e.num("generation"), World: e.num("world"),
				Reason: reason, DecidedBy: by, Launch: launch})
		}
	}
}

// checkSchedule is invariant 0: every planned fault fired, healed when it
// has a heal, and had the effect its kind promises: a fault that changes
// the ring took its target out of a later generation, one that kills the
// job was followed by a relaunch. (A signal fault also checks its signal
// took hold when it sends it: see signalFault.)
func (ru *run) checkSchedule(out *Outcome) Verdict {
	var bad, did []string
	for _, f := range ru.faults {
		switch {
		case f.Error != "":
			bad = append(bad, fmt.Sprintf("fault %d (%s): %s", f.Index, f.Kind, f.Error))
		case f.Injected.IsZero():
			bad = append(bad, fmt.Sprintf("fault %d (%s): never triggered (step %d)", f.Index, f.Kind, f.Step))
		case f.Duration > 0 && f.Healed.IsZero():
			bad = append(bad, fmt.Sprintf("fault %d (%s): never healed", f.Index, f.Kind))
		case f.Kind == "sigkill" && f.TargetPid != 0 && exitOf(out.Events, f.TargetPid) != "signal: killed":
			bad = append(bad, fmt.Sprintf("fault %d (%s) had no effect: its target, rank %d (pid %d), ended with %q, not killed (%s)",
				f.Index, f.Kind, f.TargetRank, f.TargetPid, cmp.Or(exitOf(out.Events, f.TargetPid), "no exit seen"), f.What))
		case f.Changes == "ring" && f.TargetID != "" && !leftRing(out.Events, f):
			bad = append(bad, fmt.Sprintf("fault %d (%s) had no effect: its target, rank %d (worker %s), is in every generation after it (%s)",
				f.Index, f.Kind, f.TargetRank, f.TargetID, f.What))
		case f.Changes == "resume" && out.Launches <= f.Attempt:
			bad = append(bad, fmt.Sprintf("fault %d (%s) had no effect: launch %d was the last (%s)", f.Index, f.Kind, f.Attempt, f.What))
		default:
			did = append(did, fmt.Sprintf("fault %d at step %d: %s", f.Index, f.AtStep, f.What))
		}
	}
	if len(bad) > 0 {
		return verdict(0, false, "%s", joinLimited(bad, 5))
	}
	return verdict(0, true, "%s", joinLimited(did, 5))
}

// exitOf is how worker process pid ended, as its launcher saw it ("exit
// 0", "signal: killed"; "" when no exit was seen).
func exitOf(evs []Event, pid int64) string {
	for _, e := range evs {
		if e.Kind == "worker_exited" && e.num("pid") == pid {
			s, _ := e.Fields["status"].(string)
			return s
		}
	}
	return ""
}

// leftRing says whether a generation decided after fault f, in the launch
// it was injected into, leaves its target out.
func leftRing(evs []Event, f *FaultRecord) bool {
	launch := 0
	for _, e := range evs {
		if e.Kind == "job_started" {
			launch++
		}
		if launch != f.Attempt || e.Kind != "generation" || e.At.Before(f.Injected) {
			continue
		}
		ms, _ := e.Fields["members"].([]any)
		in := false
		for _, m := range ms {
			mm, _ := m.(map[string]any)
			in = in || mm["id"] == f.TargetID
		}
		if !in {
			return true
		}
	}
	return false
}

// requireApplicable fails every verdict that found nothing to check (n/a)
// although na does not excuse it: a fault that silently did nothing, a
// store that was never read, must not pass.
func requireApplicable(vs []Verdict, na map[int]string) {
	for i, v := range vs {
		if _, ok := na[v.N]; v.Status == "n/a" && !ok {
			vs[i] = verdict(v.N, false, "n/a, but the scenario's job and faults make it apply: %s", v.Evidence)
		}
	}
}

// inapplicable are the invariants the scenario's job and faults leave
// nothing to check, and why; any other that finds nothing to check fails.
func (s *Scenario) inapplicable(kinds Kinds) map[int]string {
	na := map[int]string{}
	if s.Job.CheckpointEvery == 0 {
		na[5] = "the job takes no checkpoints"
	}
	timed, failover := false, false
	for _, f := range s.Faults {
		c := kinds[f.Kind].Changes
		timed = timed || c == "ring" || c == "resume"
		failover = failover || f.Kind == "ps-primary-kill" || f.Kind == "ps-ack-lost"
	}
	if !timed {
		na[8] = "no fault of the scenario changes the ring or kills the job"
	}
	if s.Job.Kind == "ps" {
		if !failover {
			na[3] = "no fault fails a shard over: no backup is promoted"
		}
	} else {
		na[6] = "a ring job has no parameter server"
	}
	for _, n := range s.NotApplicable {
		na[n] = "the scenario says so"
	}
	return na
}

func (ru *run) checkEnd(out *Outcome) Verdict {
	var stopped *phalanx.StoppedError
	switch {
	case ru.sc.Expect == "stop":
		if errors.As(out.Err, &stopped) {
			return verdict(1, true, "stopped as expected: %v", out.Err)
		}
		return verdict(1, false, "expected a stop; the job ended with %v", out.Err)
	case out.Err != nil:
		return verdict(1, false, "the job failed after %d launches: %v", out.Launches, out.Err)
	case out.Result == nil || out.Result.Step != ru.sc.Job.Steps:
		return verdict(1, false, "the job ended at step %v, want %d", stepOf(out.Result), ru.sc.Job.Steps)
	}
	if auc, ok := out.Result.Metrics["auc"]; ok { // a parameter-server model's measure
		return verdict(1, true, "finished all %d steps in %d launch(es); held-out AUC %.4f", out.Result.Step, out.Launches, auc)
	}
	return verdict(1, true, "finished all %d steps in %d launch(es); held-out accuracy %.4f", out.Result.Step, out.Launches, out.Result.Accuracy)
}

func stepOf(r *phalanx.Result) any {
	if r == nil {
		return "none"
	}
	return r.Step
}

// trainedSteps are the step events whose work is in the final model: a
// relaunch that resumed from step S drops the earlier launches' steps
// after S, whose updates died with them, and one that found no checkpoint
// drops them all. So does a new ring that resynced to step S (restored):
// a step rank 0 reported before it died, which a survivor had not finished,
// is redone, its first update lost with rank 0.
func trainedSteps(evs []Event) []Event {
	var steps []Event
	for i, e := range evs {
		switch e.Kind {
		case "job_started":
			if !restoresNext(evs[i+1:]) {
				steps = steps[:0]
			}
		case "checkpoint_restored", "restored":
			s := e.num("step")
			steps = slices.DeleteFunc(steps, func(x Event) bool { return x.num("step") > s })
		case "step":
			steps = append(steps, e)
		}
	}
	return steps
}

// restoresNext says whether a launch whose events follow restores from a
// checkpoint before its first step.
func restoresNext(evs []Event) bool {
	for _, e := range evs {
		switch e.Kind {
		case "checkpoint_restored":
			return true
		case "step", "job_started":
			return false
		}
	}
	return false
}

func (ru *run) checkSamples(evs []Event) Verdict {
	steps := trainedSteps(evs)
	c := sampleCheck{total: ru.sc.Job.Steps}
	if ru.sc.Expect == "stop" && len(steps) > 0 {
		c.total = steps[len(steps)-1].num("step")
	}
	lc := ru.r.launchConfig(ru.sc, "check", ru.sc.Job.Workers, "", "", nil)
	c.samples, c.batch, c.seed = ru.r.samples(&lc), lc.Batch, lc.Seed
	return c.check(steps)
}

// samples is the job's training-set size: the model's "samples" option
// when it has one.
func (r *Runner) samples(lc *phalanx.LaunchConfig) int {
	spec, err := r.Registry.Lookup(lc.Model)
	if err != nil {
		return 0
	}
	o, err := spec.Resolve(lc.ModelOptions)
	if err != nil {
		return 0
	}
	n, err := o.Int("samples")
	if err != nil {
		return 0
	}
	return n
}

func lastOf(evs []Event, kind string) (Event, bool) {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == kind {
			return evs[i], true
		}
	}
	return Event{}, false
}

func checkIdentical(evs []Event) Verdict {
	d, ok := lastOf(evs, "done")
	if !ok {
		return verdict(3, false, "no done event: the ranks' parameters were never compared")
	}
	same, _ := d.Fields["parameters_identical"].(bool)
	crcs, _ := d.Fields["parameters_crc32c_by_rank"].([]any)
	var differ []string
	for r, c := range crcs {
		if c != crcs[0] {
			differ = append(differ, fmt.Sprintf("rank %d's parameters have CRC32C %08x, rank 0's %08x", r, uint32(c.(float64)), uint32(crcs[0].(float64))))
		}
	}
	switch {
	case same && len(differ) > 0:
		return verdict(3, false, "done at step %d on %d ranks: parameters_identical=true, yet %s", d.num("step"), d.num("world"), joinLimited(differ, 3))
	case !same:
		return verdict(3, false, "done at step %d on %d ranks: parameters_identical=false: %s", d.num("step"), d.num("world"), joinLimited(differ, 3))
	}
	return verdict(3, true, "done at step %d on %d ranks: parameters_identical=true (every rank's CRC32C, gathered over the ring, equal)", d.num("step"), d.num("world"))
}

func (ru *run) checkReference(out, ref *Outcome) Verdict {
	if out.Result == nil {
		return verdict(4, false, "the job has no final model")
	}
	refWorld := int64(ref.Result.World)
	bitwise := true
	var why string
	for _, f := range ru.faults {
		if f.Changes == "ring" {
			bitwise, why = false, fmt.Sprintf("fault %d (%s) changed the ring", f.Index, f.Kind)
		}
	}
	// Bitwise only if every step of both runs summed over the same ranks:
	// either run may have started on a partial ring.
	// And over the same data plane: the shared-memory fast path reduces in
	// rank order, a TCP ring in ring order, so their sums differ in the last
	// bits (a loaded machine can time out a shared-memory upgrade).
	plane := ""
	for _, run := range []struct {
		name string
		evs  []Event
	}{{"the undisturbed run", ref.Events}, {"the run", out.Events}} {
		for _, e := range run.evs {
			switch {
			case !bitwise:
			case e.Kind == "step" && e.num("world") != refWorld:
				bitwise, why = false, fmt.Sprintf("%s's step %d ran on %d ranks, not %d", run.name, e.num("step"), e.num("world"), refWorld)
			case e.Kind == "step" && e.num("stale") > 0:
				// hybrid: a step closed without a late rank's gradients
				bitwise, why = false, fmt.Sprintf("%s's step %d dropped %d late ranks' gradients as stale", run.name, e.num("step"), e.num("stale"))
			case e.Kind == "data_plane":
				p, _ := e.Fields["plane"].(string)
				if plane == "" {
					plane = p
				} else if p != plane {
					bitwise, why = false, fmt.Sprintf("%s's generation %d ran on %s, not %s", run.name, e.num("generation"), p, plane)
				}
			}
		}
	}
	got, want := out.Result, ref.Result
	if bitwise {
		return verdict(4, got.ParametersCRC == want.ParametersCRC, "bitwise: parameters CRC32C %08x, the undisturbed run's %08x (accuracy %.4f vs %.4f)",
			got.ParametersCRC, want.ParametersCRC, got.Accuracy, want.Accuracy)
	}
	tol := ru.sc.Tolerance
	if tol == 0 {
		tol = 0.01
	}
	diff := math.Abs(got.Accuracy - want.Accuracy)
	return verdict(4, diff <= tol, "not bitwise (%s): held-out accuracy %.4f, the undisturbed run's %.4f: %.4f apart (tolerance %.4f)",
		why, got.Accuracy, want.Accuracy, diff, tol)
}

func (ru *run) checkCheckpoints(ctx context.Context) Verdict {
	if ru.store == nil {
		return notApplicable(5, "the job takes no checkpoints")
	}
	infos, err := checkpoint.List(ctx, ru.store)
	if err != nil {
		return verdict(5, false, "listing the checkpoints: %v", err)
	}
	var bad, refused []string
	verified := 0
	for _, in := range infos {
		if !in.Complete {
			if ru.damaged[in.ID] {
				refused = append(refused, in.ID+": no manifest")
			}
			continue
		}
		m, err := checkpoint.ReadManifest(ctx, ru.store, in.ID)
		if err == nil {
			err = checkpoint.Verify(ctx, ru.store, m)
		}
		switch {
		case ru.damaged[in.ID] && err == nil:
			bad = append(bad, in.ID+" was damaged on purpose and still verifies")
		case ru.damaged[in.ID]:
			refused = append(refused, fmt.Sprintf("%s: %v", in.ID, err))
		case err != nil:
			bad = append(bad, fmt.Sprintf("%s: %v", in.ID, err))
		default:
			verified++
			if want, ok := ru.saved[in.ID]; ok {
				if got, err := manifestCRC(ctx, ru.store, in.ID); err != nil || got != want {
					bad = append(bad, fmt.Sprintf("%s changed after it was saved: its manifest's CRC32C is %08x (%v), its writer reported %08x", in.ID, got, err, want))
				}
			}
		}
	}
	kindNote := ""
	if cv, ok := ru.kind.(CheckpointVerifier); ok {
		n, err := cv.VerifyCheckpoints(ctx, ru.store)
		if err != nil {
			bad = append(bad, err.Error())
		}
		verified += n
		kindNote = fmt.Sprintf(" (%d of them the job kind's own, verified by it)", n)
	}
	if len(bad) > 0 {
		return verdict(5, false, "%s", joinLimited(bad, 5))
	}
	ev := fmt.Sprintf("%d complete checkpoints%s verify (every object, block and tensor checksum); the %d whose writers reported their manifests unchanged", verified, kindNote, len(ru.saved))
	if len(refused) > 0 {
		ev += "; damaged on purpose and refused: " + joinLimited(refused, 3)
	}
	return verdict(5, verified > 0, "%s", ev)
}

// manifestCRC is the CRC32C of checkpoint id's manifest as stored.
func manifestCRC(ctx context.Context, s checkpoint.Store, id string) (uint32, error) {
	name := id + "/" + checkpoint.ManifestName
	objs, err := s.List(ctx, name)
	if err != nil {
		return 0, err
	}
	for _, o := range objs {
		if o.Name == name {
			b := make([]byte, o.Size)
			if err := s.ReadAt(ctx, name, b, 0); err != nil {
				return 0, err
			}
			return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)), nil
		}
	}
	return 0, fmt.Errorf("%s: %w", name, checkpoint.ErrNotFound)
}

func (ru *run) checkLeftovers(evs []Event) Verdict {
	var bad, notes []string
	for pid := range ru.pids {
		if err := syscall.Kill(int(pid), 0); err == nil || !errors.Is(err, syscall.ESRCH) {
			bad = append(bad, fmt.Sprintf("process %d still exists", pid))
		}
	}
	for addr := range ru.addrs {
		if ru.sc.Job.Network == "netns" {
			break // the lab's own Leftovers cover its addresses (a default route may answer any)
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			// A port the job's process freed may be another's since (the
			// kernel hands ephemeral ports out again): only a listener of
			// the job's, or one whose owner cannot be seen, is left over.
			if pid, err := sockowner.Listener(addr); err == nil && pid != 0 && !ru.pids[int64(pid)] && !isMarked(pid, ru.marker) {
				notes = append(notes, fmt.Sprintf("port %s is another process's now (pid %d)", addr, pid))
				continue
			}
			bad = append(bad, "port "+addr+" still accepts connections")
		}
	}
	procs, err := markedProcesses(ru.marker)
	if err != nil {
		bad = append(bad, err.Error())
	}
	for _, p := range procs {
		bad = append(bad, fmt.Sprintf("process %d (%s) of the job's still runs", p.pid, p.comm))
	}
	var jobs []string
	for _, e := range evs {
		if e.Kind == "job_started" {
			j, _ := e.Fields["job"].(string)
			jobs = append(jobs, j)
		}
	}
	dir := cmp.Or(ru.shmDir, shmDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		bad = append(bad, fmt.Sprintf("the shared-memory files could not be listed: %v", err))
	}
	for _, ent := range ents {
		for _, j := range jobs {
			if collective.ShmSegmentOf(ent.Name(), j) {
				bad = append(bad, "shared-memory file "+filepath.Join(dir, ent.Name())+" of launch "+j)
			}
		}
	}
	for _, s := range ru.services {
		for _, l := range s.Leftovers() {
			bad = append(bad, s.Name()+": "+l)
		}
	}
	if len(bad) > 0 {
		return verdict(7, false, "%s", joinLimited(bad, 5))
	}
	reused := ""
	if len(notes) > 0 {
		reused = "; " + joinLimited(notes, 5)
	}
	return verdict(7, true, "%d worker processes gone, no process of the job's left (their environments searched), %d data-plane ports closed or another's%s, no shared-memory file of the job's %d launch(es)",
		len(ru.pids), len(ru.addrs), reused, len(jobs))
}

func (ru *run) checkRecovery(rep *Report, bound time.Duration) Verdict {
	var timed []recovery
	for _, f := range ru.faults {
		if f.Changes != "ring" && f.Changes != "resume" || f.Injected.IsZero() || f.Error != "" {
			continue
		}
		if f.RecoveredAt.IsZero() {
			timed = append(timed, recovery{fault: f, missing: "no step of a new ring after it"})
			continue
		}
		rep.RecoveryMaxS = max(rep.RecoveryMaxS, f.RecoveryS)
		timed = append(timed, recovery{fault: f, how: fmt.Sprintf("%.2fs", f.RecoveryS)})
	}
	return recoveryVerdict(timed, bound, "no fault changed the ring", "injection to the first step of the new ring")
}

// recovery is a timed fault's outcome for invariant 8: how it recovered
// (its FaultRecord's RecoveryS the time), or why it did not.
type recovery struct {
	fault   *FaultRecord
	how     string // how it recovered, when it did
	missing string // why it did not ("": it did)
}

// recoveryVerdict is invariant 8 over the timed faults: each recovered,
// within bound. none is the evidence when no fault was timed; what names
// the span timed.
func recoveryVerdict(timed []recovery, bound time.Duration, none, what string) Verdict {
	var bad, got []string
	for _, r := range timed {
		f := r.fault
		if r.missing != "" {
			bad = append(bad, fmt.Sprintf("fault %d (%s): %s", f.Index, f.Kind, r.missing))
			continue
		}
		got = append(got, fmt.Sprintf("fault %d (%s): %s", f.Index, f.Kind, r.how))
		if f.RecoveryS > bound.Seconds() {
			bad = append(bad, fmt.Sprintf("fault %d (%s): %.2fs, over the bound %v", f.Index, f.Kind, f.RecoveryS, bound))
		}
	}
	switch {
	case len(timed) == 0:
		return notApplicable(8, none)
	case len(bad) > 0:
		return verdict(8, false, "%s", joinLimited(bad, 5))
	}
	return verdict(8, true, "%s: %s (bound %v)", what, joinLimited(got, 5), bound)
}
