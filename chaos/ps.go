package chaos

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/phalanx-rt/phalanx"
	"github.com/phalanx-rt/phalanx/coordinator"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
	"github.com/phalanx-rt/phalanx/ps"
	pscluster "github.com/phalanx-rt/phalanx/ps/cluster"
)

// A parameter-server job (job.kind ps) is the sparse-lr example (or
// job.model) over parameter servers. Besides the model's own options,
// job.options takes these, which configure the servers and are not passed
// to the model:
//
//	consistency   bsp (default), ssp or asp
//	ps-servers    server processes (default 2)
//	ps-shards     shards of the parameters (default one per server)
//	ps-replicas   backups of each shard (default 1: a primary can be killed)
//	ps-partition  hash (default) or range
//	report-every  steps between step events (default a fiftieth of the job)
//
// job.steps must be the model's step count: for sparse-lr, (examples /
// workers / (batch / workers)) × epochs (psModelSteps).
const (
	psOptConsistency = "consistency"
	psOptServers     = "ps-servers"
	psOptShards      = "ps-shards"
	psOptReplicas    = "ps-replicas"
	psOptPartition   = "ps-partition"
	psOptReportEvery = "report-every"
)

// psDefaultModel is the model of a ps job that names none.
const psDefaultModel = "sparse-lr"

// psDefaultTolerance is invariant 4's AUC bound for a ps job whose
// scenario sets none: a lost worker's or primary's steps are applied once
// either way, only the order of the servers' float sums differs (the
// command's own test holds a lost worker within 0.002; the built-in
// scenarios measure 1e-8 to 3e-8 under bsp).
const psDefaultTolerance = 0.002

func isPSOption(k string) bool {
	switch k {
	case psOptConsistency, psOptServers, psOptShards, psOptReplicas, psOptPartition, psOptReportEvery:
		return true
	}
	return false
}

// psConfigure makes a launch of a scenario's job.kind "ps" a
// parameter-server job.
func psConfigure(sc *Scenario, lc *phalanx.LaunchConfig) {
	j := sc.Job
	if j.Model == "" {
		lc.Model = psDefaultModel
	}
	model := map[string]string{}
	for k, v := range j.Options {
		if !isPSOption(k) {
			model[k] = v
		}
	}
	lc.ModelOptions = model
	opt := func(k string, def int) int {
		if n, err := strconv.Atoi(j.Options[k]); err == nil {
			return n
		}
		return def
	}
	lc.PS.Servers = opt(psOptServers, 2)
	lc.PS.Shards = opt(psOptShards, lc.PS.Servers)
	lc.PS.Replicas = opt(psOptReplicas, min(1, lc.PS.Servers-1))
	if p := j.Options[psOptPartition]; p != "" {
		lc.PS.Partition = p
	}
	lc.PS.ReportEvery = opt(psOptReportEvery, int(max(1, j.Steps/50)))
	lc.Sync.Mode = "bsp"
	if c := j.Options[psOptConsistency]; c != "" {
		lc.Sync.Mode = phalanx.SyncMode(c)
	}
	if j.LeaseTTL == 0 {
		lc.LeaseTTL = psLeaseTTL
	}
}

// psLeaseTTL is a ps job's lease when job.lease_ttl is unset: how long a
// dead primary's or worker's lease lasts, most of a failover's or an
// adoption's recovery. 2s lapsed live servers' and workers' leases on a
// loaded 2-core machine (a keepalive every TTL/3 must get through); 5s is
// the library's default.
const psLeaseTTL = 5 * time.Second

// psModelSteps is the step count of a scenario's sparse-lr job (what its
// job.steps must be), or 0 for another model.
func psModelSteps(r *Runner, sc *Scenario) int64 {
	lc := r.launchConfig(sc, "steps", sc.Job.Workers, "", "", nil)
	g, ok := psGeometryOf(r, &lc)
	if !ok {
		return 0
	}
	return g.perEpoch * g.epochs
}

// psGeometry is how sparse-lr lays its examples out: share s trains, at
// step k (from 0) of each epoch, examples s*examples/workers + k*batch
// + 0..batch-1.
type psGeometry struct {
	examples, workers, batch, perEpoch, epochs int64
}

func psGeometryOf(r *Runner, lc *phalanx.LaunchConfig) (psGeometry, bool) {
	if lc.Model != psDefaultModel || r.Registry == nil || lc.Workers < 1 {
		return psGeometry{}, false
	}
	spec, err := r.Registry.Lookup(lc.Model)
	if err != nil {
		return psGeometry{}, false
	}
	o, err := spec.Resolve(lc.ModelOptions)
	if err != nil {
		return psGeometry{}, false
	}
	ex, err1 := o.Int("examples")
	ep, err2 := o.Int("epochs")
	if err1 != nil || err2 != nil {
		return psGeometry{}, false
	}
	g := psGeometry{examples: int64(ex), workers: int64(lc.Workers), batch: int64(lc.Batch / lc.Workers), epochs: int64(ep)}
	if g.batch < 1 {
		return psGeometry{}, false
	}
	g.perEpoch = g.examples / g.workers / g.batch
	return g, g.perEpoch > 0
}

// psPush is a shard's account of one share's pushes (ps_pushes): again
// and skipped are the first step applied twice and the first never
// applied below a later one (0: none).
type psPush struct{ share, last, applied, dups, base, again, skipped int64 }

// irregular names the steps of the share the shard applied out of
// sequence, or is "".
func (p psPush) irregular() string {
	var out []string
	if p.again > 0 {
		out = append(out, fmt.Sprintf("share %d's step %d applied twice", p.share, p.again))
	}
	if p.skipped > 0 {
		out = append(out, fmt.Sprintf("share %d's step %d never applied", p.share, p.skipped))
	}
	return strings.Join(out, " and ")
}

// taken is the account's count in words.
func (p psPush) taken() string {
	return fmt.Sprintf("%d pushes taken for steps %d..%d", p.applied, p.base+1, p.last)
}

// psAccount is one ps_pushes event.
type psAccount struct {
	table, shard, clock int64
	exactlyOnce         any // bool, or nil under asp
	pushes              []psPush
}

// psFacts are the events of a ps job's last launch, read.
type psFacts struct {
	workers, shards, steps      int64
	consistency                 string
	done                        *Event
	accounts                    []psAccount
	claims, finished            map[int64][]Event // ps_share and ps_share_done by share
	failovers, lost, stepEvents []Event
}

func psFactsOf(evs []Event) psFacts {
	for i := len(evs) - 1; i >= 0; i-- { // the last launch's
		if evs[i].Kind == "job_started" {
			evs = evs[i:]
			break
		}
	}
	f := psFacts{claims: map[int64][]Event{}, finished: map[int64][]Event{}}
	for i, e := range evs {
		switch e.Kind {
		case "job_started":
			f.workers, f.shards = e.num("workers"), e.num("ps_shards")
			f.consistency, _ = e.Fields["consistency"].(string)
		case "done":
			f.done = &evs[i]
			f.steps = e.num("steps")
		case "ps_pushes":
			a := psAccount{table: e.num("table"), shard: e.num("shard"), clock: e.num("clock"), exactlyOnce: e.Fields["exactly_once"]}
			ps, _ := e.Fields["pushes"].([]any)
			for _, p := range ps {
				m, _ := p.(map[string]any)
				x := Event{Fields: m}
				a.pushes = append(a.pushes, psPush{share: x.num("share"), last: x.num("last"), applied: x.num("applied"),
					dups: x.num("duplicates"), base: x.num("base"), again: x.num("again"), skipped: x.num("skipped")})
			}
			slices.SortFunc(a.pushes, func(x, y psPush) int { return int(x.share - y.share) })
			f.accounts = append(f.accounts, a)
		case "ps_share":
			f.claims[e.num("share")] = append(f.claims[e.num("share")], e)
		case "ps_share_done":
			f.finished[e.num("share")] = append(f.finished[e.num("share")], e)
		case "ps_failover":
			f.failovers = append(f.failovers, e)
		case "ps_worker_lost":
			f.lost = append(f.lost, e)
		case "step":
			f.stepEvents = append(f.stepEvents, e)
		}
	}
	return f
}

// psVerdicts replace the ring invariants that do not fit a
// parameter-server job (2, 3, 4, 6) with its own, and time its faults'
// recovery (8): a ps job has no ring generations to time it by.
func psVerdicts(ctx context.Context, ru *run, out, ref *Outcome) []Verdict {
	f, rf := psFactsOf(out.Events), psFactsOf(ref.Events)
	lc := ru.r.launchConfig(ru.sc, "check", int(max(f.workers, 1)), "", "", nil)
	g, geo := psGeometryOf(ru.r, &lc)
	return []Verdict{
		psCheckExamples(f, g, geo),
		psCheckReplicas(f, rf),
		psCheckModel(out, ref, ru.sc.Tolerance),
		psCheckPushes(f, rf),
		psCheckRecovery(ru.faults, f, time.Duration(ru.sc.RecoveryBound)),
	}
}

// psCheckExamples is invariant 2: every share trained to the end by one
// worker at a time, and (sparse-lr, a push every step) every example of
// every epoch trained exactly once, on every shard, from the shards' own
// accounts of the steps they applied.
func psCheckExamples(f psFacts, g psGeometry, geo bool) Verdict {
	if f.done == nil {
		return verdict(2, false, "no done event: the job did not finish")
	}
	var bad, adopted []string
	for share := range f.workers {
		if n := len(f.finished[share]); n != 1 {
			bad = append(bad, fmt.Sprintf("share %d finished %d times", share, n))
		}
		for _, c := range f.claims[share] {
			if c.Fields["reason"] == "adopted" {
				adopted = append(adopted, fmt.Sprintf("share %d adopted by worker %d (pid %d) from step %d, replayed to %d",
					share, c.num("worker"), c.num("pid"), c.num("from"), c.num("replayed_to")))
			}
		}
	}
	if len(bad) > 0 {
		return verdict(2, false, "%s", joinLimited(bad, 5))
	}
	claims := fmt.Sprintf("%d shares each finished once (%d claims", f.workers, len(flatten(f.claims)))
	if len(adopted) > 0 {
		claims += "; " + joinLimited(adopted, 3)
	}
	claims += ")"
	if len(f.accounts) == 0 {
		return verdict(2, false, "%s, but no shard accounted for its pushes (no ps_pushes event)", claims)
	}
	if f.consistency == "asp" || !geo {
		// A step pushes only the shards its keys fall on (asp), or the
		// model's examples are not laid out as sparse-lr's: the steps each
		// share trained, from the shards' highest step.
		for share := range f.workers {
			var last int64
			for _, a := range f.accounts {
				for _, p := range a.pushes {
					if w := p.irregular(); w != "" {
						return verdict(2, false, "%s; but shard %d: %s (%s)", claims, a.shard, w, p.taken())
					}
					if p.share == share {
						last = max(last, p.last)
					}
				}
			}
			if last != f.steps {
				return verdict(2, false, "%s; but share %d's last step on any shard is %d of %d", claims, share, last, f.steps)
			}
		}
		return verdict(2, true, "%s; every share's last step %d reached the shards (%s: examples not mapped to steps)", claims, f.steps, f.consistency)
	}
	trained := g.workers * g.perEpoch * g.batch
	epochs := (f.steps + g.perEpoch - 1) / g.perEpoch
	for _, a := range f.accounts {
		counts := make([][]uint8, epochs)
		for e := range counts {
			counts[e] = make([]uint8, g.examples)
		}
		var from int64 = -1
		for _, p := range a.pushes {
			if w := p.irregular(); w != "" || p.applied != p.last-p.base {
				if w == "" {
					w = "a step skipped or applied twice"
				}
				return verdict(2, false, "shard %d's account of share %d: %d steps applied after step %d, up to step %d: %s",
					a.shard, p.share, p.applied, p.base, p.last, w)
			}
			if from < 0 || p.base < from {
				from = p.base
			}
			lo := p.share * g.examples / g.workers
			for step := p.base + 1; step <= p.last; step++ {
				e, k := (step-1)/g.perEpoch, (step-1)%g.perEpoch
				for i := range g.batch {
					x := lo + k*g.batch + i
					if counts[e][x]++; counts[e][x] > 1 {
						return verdict(2, false, "shard %d: example %d of epoch %d trained twice (share %d, step %d)", a.shard, x, e+1, p.share, step)
					}
				}
			}
		}
		for e := max(from, 0) / g.perEpoch; e < epochs; e++ {
			n := int64(0)
			for _, c := range counts[e] {
				n += int64(c)
			}
			if n != trained {
				return verdict(2, false, "shard %d: %d examples of epoch %d trained, want %d (%d shares × %d steps × %d)",
					a.shard, n, e+1, trained, g.workers, g.perEpoch, g.batch)
			}
		}
	}
	return verdict(2, true, "%s; on each of the %d shards, each of the %d epochs trained each of its %d examples exactly once (%d shares × %d steps × batch %d; %d of %d examples outside every share's steps)",
		claims, len(f.accounts), epochs, trained, g.workers, g.perEpoch, g.batch, g.examples-trained, g.examples)
}

func flatten(m map[int64][]Event) []Event {
	var out []Event
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k]...)
	}
	return out
}

// psCheckReplicas is invariant 3 as far as it can be checked: a backup's
// rows are never read (the servers end with the job), but a shard that
// failed over ends on its promoted backup, whose account of every share's
// pushes must be the undisturbed run's primary's.
func psCheckReplicas(f, rf psFacts) Verdict {
	if len(f.failovers) == 0 {
		return notApplicable(3, "no shard failed over: a backup's rows are not read (the servers end with the job)")
	}
	var got []string
	for _, fo := range f.failovers {
		shard := fo.num("shard")
		a, ok := accountOf(f.accounts, shard)
		b, ok2 := accountOf(rf.accounts, shard)
		switch {
		case !ok:
			return verdict(3, false, "shard %d failed over from %v to %v and gave no account at the end", shard, fo.Fields["old"], fo.Fields["new"])
		case !ok2:
			return verdict(3, false, "the undisturbed run has no account of shard %d", shard)
		case a.clock != b.clock || !sameApplied(a.pushes, b.pushes):
			return verdict(3, false, "shard %d's promoted backup %v ended at clock %d with %s; the undisturbed primary at clock %d with %s",
				shard, fo.Fields["new"], a.clock, firstApart(a.pushes, b.pushes), b.clock, firstApart(b.pushes, a.pushes))
		}
		got = append(got, fmt.Sprintf("shard %d's backup %v, promoted from %v, ended at clock %d with every share's %d pushes, as the undisturbed primary",
			shard, fo.Fields["new"], fo.Fields["old"], a.clock, a.pushes[0].applied))
	}
	return verdict(3, true, "%s (backups not promoted are not read)", joinLimited(got, 3))
}

func accountOf(as []psAccount, shard int64) (psAccount, bool) {
	for _, a := range as {
		if a.shard == shard {
			return a, len(a.pushes) > 0
		}
	}
	return psAccount{}, false
}

// sameApplied: the same steps of every share applied (duplicates refused
// may differ: a disturbed run replays some).
func sameApplied(a, b []psPush) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !samePush(a[i], b[i]) {
			return false
		}
	}
	return true
}

func samePush(a, b psPush) bool {
	return a.share == b.share && a.last == b.last && a.applied == b.applied && a.base == b.base && a.again == b.again && a.skipped == b.skipped
}

// firstApart is a's account of the first share where a and b differ, in
// words.
func firstApart(a, b []psPush) string {
	for i, p := range a {
		if i < len(b) && samePush(p, b[i]) {
			continue
		}
		if w := p.irregular(); w != "" {
			return fmt.Sprintf("%s (share %d: %s)", w, p.share, p.taken())
		}
		return fmt.Sprintf("share %d: %s", p.share, p.taken())
	}
	return fmt.Sprintf("%d shares' pushes", len(a))
}

// psCheckModel is invariant 4: the held-out AUC within the tolerance of
// the undisturbed run's. Bitwise equality is not required: a ps job's
// result has no parameters checksum, and its servers may sum pushes in
// arrival order; an AUC equal to the last bit is said so.
func psCheckModel(out, ref *Outcome, tol float64) Verdict {
	if out.Result == nil || ref.Result == nil {
		return verdict(4, false, "the job has no final model")
	}
	got, ok1 := out.Result.Metrics["auc"]
	want, ok2 := ref.Result.Metrics["auc"]
	if !ok1 || !ok2 {
		return verdict(4, false, "no held-out AUC: the run's metrics %v, the undisturbed run's %v", out.Result.Metrics, ref.Result.Metrics)
	}
	if tol == 0 {
		tol = psDefaultTolerance
	}
	d := math.Abs(got - want)
	if got == want {
		return verdict(4, true, "held-out AUC %.6f, bitwise the undisturbed run's (tolerance %.4f); log-loss %.6f vs %.6f; the teacher's AUC %.4f",
			got, tol, out.Result.Metrics["logloss"], ref.Result.Metrics["logloss"], out.Result.Metrics["bayes_auc"])
	}
	return verdict(4, d <= tol, "not bitwise (servers sum pushes in arrival order): held-out AUC %.6f, the undisturbed run's %.6f: %.1e apart (tolerance %.4f); log-loss %.6f vs %.6f; the teacher's AUC %.4f",
		got, want, d, tol, out.Result.Metrics["logloss"], ref.Result.Metrics["logloss"], out.Result.Metrics["bayes_auc"])
}

// psCheckPushes is invariant 6: on every shard, every share's steps
// pushed once each (a push's id is its step), the replays after a
// takeover or a failover refused as duplicates and counted.
func psCheckPushes(f, rf psFacts) Verdict {
	if f.done == nil {
		return verdict(6, false, "no done event: the shards' accounts were not read")
	}
	if want := f.shards; want > 0 && int64(len(f.accounts)) < want {
		return verdict(6, false, "%d shard accounts (ps_pushes) for %d shards", len(f.accounts), want)
	}
	var refused, counted, refRefused int64
	for _, a := range f.accounts {
		if int64(len(a.pushes)) != f.workers {
			return verdict(6, false, "shard %d accounts for %d shares, not %d", a.shard, len(a.pushes), f.workers)
		}
		for _, p := range a.pushes {
			refused += p.dups
			switch w := p.irregular(); {
			case w != "":
				return verdict(6, false, "shard %d: %s (%s; %d refused as duplicates)", a.shard, w, p.taken(), p.dups)
			case f.consistency == "asp" && p.applied > p.last-p.base:
				return verdict(6, false, "shard %d took %d pushes of share %d for steps %d..%d: one applied twice", a.shard, p.applied, p.share, p.base+1, p.last)
			case f.consistency != "asp" && (p.last != f.steps || p.applied != p.last-p.base):
				return verdict(6, false, "shard %d's account of share %d: last step %d of %d, %d pushes taken since step %d: a push lost or applied twice",
					a.shard, p.share, p.last, f.steps, p.applied, p.base)
			}
		}
		if f.consistency != "asp" && a.exactlyOnce != true {
			return verdict(6, false, "shard %d: exactly_once %v", a.shard, a.exactlyOnce)
		}
		if f.consistency != "asp" && a.clock != f.steps {
			return verdict(6, false, "shard %d closed %d clocks of %d", a.shard, a.clock, f.steps)
		}
	}
	for _, d := range flatten(f.finished) {
		counted += d.num("duplicates")
	}
	for _, a := range rf.accounts {
		for _, p := range a.pushes {
			refRefused += p.dups
		}
	}
	what := fmt.Sprintf("each share's steps 1..%d taken exactly once on every shard (applied = last − base, clock %d)", f.steps, f.steps)
	if f.consistency == "asp" {
		what = fmt.Sprintf("no share's step taken twice on any shard (asp: a step pushes only the shards its keys fall on; last step %d)", f.steps)
	}
	return verdict(6, true, "%d shard accounts × %d shares: %s; %d replayed pushes refused as duplicates by the shards (the workers finishing the shares counted %d; the undisturbed run's shards %d)",
		len(f.accounts), f.workers, what, refused, counted, refRefused)
}

// psCheckRecovery is invariant 8 for a ps job: from a fault's injection to
// the first step after the job took it in (a shard's failover, or the lost
// worker's shares adopted), within the bound.
func psCheckRecovery(faults []*FaultRecord, f psFacts, bound time.Duration) Verdict {
	if bound == 0 {
		bound = time.Minute
	}
	var timed []recovery
	for _, fr := range faults {
		if fr.Injected.IsZero() || fr.Error != "" {
			continue
		}
		var took time.Time
		var what string
		killed := func(x *psPrimaryKill) {
			for _, fo := range f.failovers {
				if fo.num("shard") == x.shard && fo.Fields["old"] == x.server && fo.At.After(fr.Injected) {
					took, what = fo.At, fmt.Sprintf("shard %d failed over to %v after %.2fs", x.shard, fo.Fields["new"], fo.At.Sub(fr.Injected).Seconds())
					break
				}
			}
		}
		switch x := fr.fault.(type) {
		case *psPrimaryKill:
			killed(x)
		case *psAckLost:
			killed(&x.psPrimaryKill)
		case *psWorkerKill:
			left := map[int64]bool{}
			for _, s := range x.shares {
				left[s] = true
			}
			for _, c := range flatten(f.claims) {
				if left[c.num("share")] && c.Fields["reason"] == "adopted" && c.At.After(fr.Injected) {
					delete(left, c.num("share"))
					if c.At.After(took) {
						took = c.At
					}
				}
			}
			if len(left) > 0 {
				took = time.Time{}
			} else {
				what = fmt.Sprintf("shares %v adopted after %.2fs", x.shares, took.Sub(fr.Injected).Seconds())
			}
		default:
			continue
		}
		if took.IsZero() {
			timed = append(timed, recovery{fault: fr, missing: "the job never took it in (no failover or adoption after it)"})
			continue
		}
		for _, s := range f.stepEvents {
			if !s.At.Before(took) {
				fr.RecoveredAt, fr.RecoveryS = s.At, s.At.Sub(fr.Injected).Seconds()
				break
			}
		}
		if x, ok := fr.fault.(*psWorkerKill); ok && fr.RecoveredAt.IsZero() {
			// Under asp only share 0's worker reports steps, and it may be
			// done by the adoption: an adopted share finished is the
			// progress after it.
			first := int64(-1)
			for _, sh := range x.shares {
				for _, d := range f.finished[sh] {
					if !d.At.Before(took) && (fr.RecoveredAt.IsZero() || d.At.Before(fr.RecoveredAt)) {
						fr.RecoveredAt, fr.RecoveryS, first = d.At, d.At.Sub(fr.Injected).Seconds(), sh
					}
				}
			}
			if first >= 0 {
				timed = append(timed, recovery{fault: fr, how: fmt.Sprintf("%s, no step reported after it; adopted share %d finished after %.2fs",
					what, first, fr.RecoveryS)})
				continue
			}
		}
		if fr.RecoveredAt.IsZero() {
			timed = append(timed, recovery{fault: fr, missing: what + ", and no step after"})
			continue
		}
		timed = append(timed, recovery{fault: fr, how: fmt.Sprintf("%s, first step (%d) after %.2fs", what,
			stepAt(f.stepEvents, fr.RecoveredAt), fr.RecoveryS)})
	}
	return recoveryVerdict(timed, bound, "no fault of the parameter-server job was timed",
		"injection to the first step after the job took the fault in")
}

func stepAt(steps []Event, at time.Time) int64 {
	for _, s := range steps {
		if s.At.Equal(at) {
			return s.num("step")
		}
	}
	return 0
}

// psKinds are the parameter-server faults.
func psKinds() []Kind {
	return []Kind{
		{Name: "ps-primary-kill", Doc: "SIGKILL the parameter server that is primary of a shard (the fault's pick chooses the shard; job.kind ps with a backup per shard): its backup takes over once the lease expires, the workers resend what was not acknowledged",
			Changes: "ring", Needs: "ps",
			New: func(p Planned) Fault { return &psPrimaryKill{pick: p.Pick} }},
		{Name: "ps-ack-lost", Doc: "SIGSTOP the backup of a shard (the fault's pick chooses the shard; job.kind ps, the backup no shard's primary: one shard on two servers) for the fault's duration, in which every worker's next push reaches the primary, is forwarded to the frozen backup and waits for its acknowledgement; then SIGKILL the primary and SIGCONT the backup: it takes over holding every push in flight, which the workers resend, each to be refused as a duplicate",
			Changes: "ring", Needs: "ps",
			New: func(p Planned) Fault {
				return &psAckLost{psPrimaryKill: psPrimaryKill{pick: p.Pick}, hold: time.Duration(p.Duration)}
			}},
		{Name: "ps-worker-kill", Doc: "SIGKILL the parameter-server worker process training a share (the fault's pick chooses the share among those in training; job.kind ps): another worker adopts its shares and resumes them where the shards say they stopped",
			Changes: "ring", Needs: "ps",
			New: func(p Planned) Fault { return &psWorkerKill{pick: p.Pick} }},
	}
}

// psEtcd is the running job's records in its etcd; the scheduler
// connected their client (env.run.cli, from the job_started event) before
// injecting.
func psEtcd(env *Env) (*coordinator.Job, error) {
	if env.run == nil || env.run.cli == nil {
		return nil, fmt.Errorf("the job's etcd is not connected (no job_started event yet?)")
	}
	if env.run.sc.Job.Kind != "ps" {
		return nil, fmt.Errorf("not a parameter-server job (job.kind %q)", env.run.sc.Job.Kind)
	}
	return env.run.coord()
}

// psShardMap reads the job's shard map and records its servers' addresses,
// which invariant 7 then checks are closed after the run.
func psShardMap(ctx context.Context, env *Env, coord *coordinator.Job) (*phalanxpb.ShardMap, error) {
	m, _, err := coord.ReadShardMap(ctx)
	if err != nil || m == nil {
		return m, err
	}
	for _, srv := range m.Servers {
		if srv.Addr != "" {
			env.run.addrs[srv.Addr] = true
		}
	}
	return m, nil
}

// psPrimaryKill SIGKILLs the primary of a shard.
type psPrimaryKill struct {
	pick   uint64
	shard  int64
	server string
	pid    int
}

// pickedShard reads the job's shard map and the shard pick chooses in it:
// the target of a fault on a shard's servers.
func pickedShard(ctx context.Context, env *Env, pick uint64) (*phalanxpb.ShardMap, *phalanxpb.ShardPlacement, error) {
	coord, err := psEtcd(env)
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := psShardMap(cctx, env, coord)
	if err != nil {
		return nil, nil, err
	}
	if m == nil || len(m.Shards) == 0 {
		return nil, nil, fmt.Errorf("the job has no shard map yet")
	}
	return m, m.Shards[pick%uint64(len(m.Shards))], nil
}

func (f *psPrimaryKill) Inject(ctx context.Context, env *Env) (string, error) {
	m, s, err := pickedShard(ctx, env, f.pick)
	if err != nil {
		return "", err
	}
	f.shard, f.server = int64(s.Shard), s.Primary
	for _, srv := range m.Servers {
		if srv.Id == s.Primary {
			f.pid = int(srv.Pid)
		}
	}
	if f.pid <= 0 {
		return "", fmt.Errorf("shard %d's primary %s has no pid in shard map %d", s.Shard, s.Primary, m.Generation)
	}
	if len(s.Backups) == 0 {
		return "", fmt.Errorf("shard %d has no backup (job.options %s): its primary's death would end the job", s.Shard, psOptReplicas)
	}
	if err := syscall.Kill(f.pid, syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("SIGKILL to parameter server %s (pid %d): %w", f.server, f.pid, err)
	}
	return fmt.Sprintf("SIGKILL to parameter server %s (pid %d), primary of shard %d of %d in shard map %d (backups %s)",
		f.server, f.pid, s.Shard, len(m.Shards), m.Generation, strings.Join(s.Backups, ", ")), nil
}

func (f *psPrimaryKill) Heal(context.Context, *Env) (string, error) { return "", nil }

// psAckLost loses the acknowledgements of pushes a backup applied: it
// freezes a shard's backup (Inject) and, the fault's duration later, once
// every worker waits for the acknowledgement of a push the primary
// forwarded, SIGKILLs the primary and thaws the backup (Heal). The backup
// applies what it was sent and takes over; every worker resends its push
// in flight with the same id: a replay, which the backup must refuse as a
// duplicate. The built-in PS scenarios replay only by chance (a kill
// between a backup's apply and the acknowledgement, a worker killed
// between its shards): this one replays one push per share every time.
type psAckLost struct {
	psPrimaryKill
	hold      time.Duration
	backup    string
	backupPid int
	froze     time.Time
}

func (f *psAckLost) Inject(ctx context.Context, env *Env) (string, error) {
	if f.hold <= 0 {
		return "", fmt.Errorf("ps-ack-lost needs a duration: how long the backup is frozen before the primary is killed")
	}
	m, s, err := pickedShard(ctx, env, f.pick)
	if err != nil {
		return "", err
	}
	if len(s.Backups) == 0 {
		return "", fmt.Errorf("shard %d has no backup (job.options %s)", s.Shard, psOptReplicas)
	}
	f.shard, f.server, f.backup = int64(s.Shard), s.Primary, s.Backups[0]
	for _, o := range m.Shards {
		if o.Primary == f.backup {
			// Frozen, it would hold every worker on that shard too, some on
			// a pull with no push in flight to the primary killed.
			return "", fmt.Errorf("shard %d's backup %s is also shard %d's primary: give the job one shard (job.options %s 1)", s.Shard, f.backup, o.Shard, psOptShards)
		}
	}
	for _, srv := range m.Servers {
		switch srv.Id {
		case f.server:
			f.pid = int(srv.Pid)
		case f.backup:
			f.backupPid = int(srv.Pid)
		}
	}
	if f.pid <= 0 || f.backupPid <= 0 {
		return "", fmt.Errorf("shard %d's primary %s (pid %d) or backup %s (pid %d) has no pid in shard map %d", s.Shard, f.server, f.pid, f.backup, f.backupPid, m.Generation)
	}
	if err := syscall.Kill(f.backupPid, syscall.SIGSTOP); err != nil {
		return "", fmt.Errorf("SIGSTOP to parameter server %s (pid %d): %w", f.backup, f.backupPid, err)
	}
	f.froze = env.run.r.now()
	return fmt.Sprintf("SIGSTOP to parameter server %s (pid %d), backup of shard %d of %d in shard map %d (primary %s, pid %d), for %v",
		f.backup, f.backupPid, s.Shard, len(m.Shards), m.Generation, f.server, f.pid, f.hold), nil
}

// Heal kills the primary, the workers' pushes in flight, and thaws the
// backup; the primary's account of each share's last step is the evidence
// of what was in flight.
func (f *psAckLost) Heal(ctx context.Context, env *Env) (string, error) {
	var what []string
	if last, err := psLastSteps(ctx, env, f.shard); err != nil {
		what = append(what, fmt.Sprintf("the primary's account not read (%v)", err))
	} else {
		var shares []string
		for share, step := range last {
			shares = append(shares, fmt.Sprintf("share %d's step %d", share, step))
		}
		what = append(what, fmt.Sprintf("the last pushes the primary %s took, forwarded to the frozen backup: %s", f.server, strings.Join(shares, ", ")))
	}
	kerr := syscall.Kill(f.pid, syscall.SIGKILL)
	if kerr == nil {
		what = append(what, fmt.Sprintf("SIGKILL to parameter server %s (pid %d), primary of shard %d", f.server, f.pid, f.shard))
	}
	if err := syscall.Kill(f.backupPid, syscall.SIGCONT); err != nil {
		return strings.Join(what, "; "), fmt.Errorf("SIGCONT to parameter server %s (pid %d): %w", f.backup, f.backupPid, err)
	}
	what = append(what, fmt.Sprintf("SIGCONT to its backup %s (pid %d), frozen %.2fs", f.backup, f.backupPid, env.run.r.now().Sub(f.froze).Seconds()))
	if kerr != nil {
		return strings.Join(what, "; "), fmt.Errorf("SIGKILL to parameter server %s (pid %d): %w", f.server, f.pid, kerr)
	}
	return strings.Join(what, "; "), nil
}

// psLastSteps is each share's last step a shard's primary took (its
// account, OpInfo), read the way a worker reads it.
func psLastSteps(ctx context.Context, env *Env, shard int64) ([]uint64, error) {
	coord, err := psEtcd(env)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel() // ends the directory's watch
	job, err := pscluster.ReadJob(cctx, coord)
	if err != nil {
		return nil, err
	}
	spec, err := pscluster.SpecOf(job)
	if err != nil {
		return nil, err
	}
	dir, err := pscluster.NewDirectory(cctx, coord)
	if err != nil {
		return nil, err
	}
	cl, err := ps.NewClient(ps.ClientConfig{Worker: 0, Tables: spec.Tables, Partition: spec.Partition, Shards: spec.Shards, Sync: spec.Sync, Directory: dir})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	info, err := cl.Info(cctx, spec.Tables[0].ID, int(shard))
	if err != nil {
		return nil, err
	}
	return info.LastIDs, nil
}

// psWorkerKill SIGKILLs the worker process training a share (the pick
// chooses among the shares in training, by number).
type psWorkerKill struct {
	pick   uint64
	pid    int
	shares []int64
}

func (f *psWorkerKill) Inject(ctx context.Context, env *Env) (string, error) {
	coord, err := psEtcd(env)
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := psShardMap(cctx, env, coord); err != nil {
		return "", err
	}
	t, _, err := coord.ReadPSShares(cctx)
	if err != nil {
		return "", err
	}
	var training []int // shares claimed and not done, each by a live worker
	for share := range t.Claims {
		if _, done := t.Done[share]; !done {
			training = append(training, share)
		}
	}
	if len(training) == 0 {
		return "", fmt.Errorf("no worker is training a share (%d claims, %d shares done)", len(t.Claims), len(t.Done))
	}
	slices.Sort(training)
	victim := t.Claims[training[f.pick%uint64(len(training))]]
	f.pid = victim.Pid
	for _, share := range training { // every share its process trains dies with it
		if t.Claims[share].Pid == f.pid {
			f.shares = append(f.shares, int64(share))
		}
	}
	slices.Sort(f.shares)
	if err := syscall.Kill(f.pid, syscall.SIGKILL); err != nil {
		return "", fmt.Errorf("SIGKILL to ps worker pid %d: %w", f.pid, err)
	}
	return fmt.Sprintf("SIGKILL to ps worker %d (pid %d), holding share(s) %v; shares %v were in training, %d done",
		victim.Index, f.pid, f.shares, training, len(t.Done)), nil
}

func (f *psWorkerKill) Heal(context.Context, *Env) (string, error) { return "", nil }

// psJob is a built-in ps scenario's job: sparse-lr on 3 workers and 2
// servers (2 shards, a backup each), bsp, 48,000 examples in 10 epochs of
// 250 steps of 64 examples per worker (a global batch of 192): about 8s
// of training on 2 cores, a step event every 25 steps. Epochs rather than
// examples make it long: each worker (and an adopter) draws the examples
// at its start.
func psJob() JobSpec {
	return JobSpec{Kind: "ps", Model: psDefaultModel,
		Options: map[string]string{"examples": "48000", "ids": "100000", "held-out": "20000", "epochs": "10",
			psOptServers: "2", psOptReplicas: "1", psOptConsistency: "bsp", psOptReportEvery: "25"},
		Workers: 3, Steps: 2500, Batch: 192, Seed: 11}
}

// psAckLostJob is psJob on one shard: its backup is no shard's primary,
// so that ps-ack-lost can freeze it and hold only the pushes' acknowledgements.
func psAckLostJob() JobSpec {
	j := psJob()
	j.Options[psOptShards] = "1"
	return j
}

// psScenarios are the built-in scenarios of parameter-server jobs. The
// primary is killed at step 1000 of 2500 rather than a time after the
// first step: mid-job on any machine, however loaded.
func psScenarios() []Scenario {
	return []Scenario{
		{Name: "ps-primary-kill", CI: true,
			Description: "SIGKILL of the parameter server that is primary of a shard mid-training: its backup takes over, every push applied once, the AUC the undisturbed run's",
			Job:         psJob(),
			Faults:      []FaultSpec{{Kind: "ps-primary-kill", Trigger: Trigger{Step: 1000}}}},
		{Name: "ps-ack-lost", CI: true,
			Description: "a shard's backup frozen while every worker's push reaches the primary, then the primary SIGKILLed and the backup thawed: the backup takes over holding pushes it never acknowledged; the workers resend them, one per share, each refused as a duplicate: every push applied once",
			Job:         psAckLostJob(),
			Faults:      []FaultSpec{{Kind: "ps-ack-lost", Trigger: Trigger{Step: 1000}, Duration: Duration(time.Second)}}},
		{Name: "ps-worker-kill", CI: true,
			Description: "SIGKILL of a parameter-server worker mid-training: another adopts its share where the shards say it stopped; every example of every epoch trained once",
			Job:         psJob(),
			Faults:      []FaultSpec{{Kind: "ps-worker-kill", Trigger: Trigger{After: Duration(2 * time.Second)}}}},
	}
}
