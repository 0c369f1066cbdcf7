package chaos

import (
	"fmt"

	"github.com/phalanx-rt/phalanx/worker"
)

// sampleCheck is invariant 2 over a run's trained steps (trainedSteps),
// in two parts that together need trust neither the trainer nor the
// sampler:
//   - each step trained the sampler's global batch: for a step every rank
//     joined, the fingerprint of the whole batch; for a hybrid step that
//     closed without some, the shards of exactly its participants, the
//     others recorded as dropped (participants + stale = world);
//   - each epoch, what was trained plus what was recorded as dropped is
//     the dataset's index set, 0..n−1, each exactly once: a closed form,
//     not the sampler's output, so a sampler that deals wrongly cannot
//     agree with itself.
type sampleCheck struct {
	samples int // the dataset's size (0: unknown, batches not fingerprinted)
	batch   int
	seed    uint64
	total   int64 // the steps the run must have trained
}

func (c sampleCheck) check(steps []Event) Verdict {
	if int64(len(steps)) != c.total {
		seen := map[int64]bool{}
		for _, e := range steps {
			if seen[e.num("step")] {
				return verdict(2, false, "%d step events for %d steps: step %d trained twice (generation %d)", len(steps), c.total, e.num("step"), e.num("generation"))
			}
			seen[e.num("step")] = true
		}
		for s := int64(1); s <= c.total; s++ {
			if !seen[s] {
				return verdict(2, false, "%d step events for %d steps: step %d never trained", len(steps), c.total, s)
			}
		}
		return verdict(2, false, "%d step events for %d steps", len(steps), c.total)
	}
	for i, e := range steps {
		if e.num("step") != int64(i+1) {
			return verdict(2, false, "step event %d is of step %d", i+1, e.num("step"))
		}
	}
	if c.samples == 0 {
		return verdict(2, true, "steps 1..%d each trained once; the job's sample count is unknown, so batches were not fingerprinted", c.total)
	}
	s, err := worker.NewSampler(c.samples, c.seed)
	if err != nil {
		return verdict(2, false, "the sampler: %v", err)
	}
	full := wholeSet(c.samples)
	var (
		pos      worker.Position
		epochSum worker.Fingerprint // trained + dropped in pos.Epoch so far
		dropped  int                // steps that recorded dropped samples
		epochs   int                // epochs proven whole
	)
	for i, e := range steps {
		step := int64(i + 1)
		world := int(e.num("world"))
		parts := int(e.num("participants"))
		if parts == 0 {
			parts = world
		}
		stale := int(e.num("stale"))
		if world < 1 || parts < 1 || parts+stale != world {
			return verdict(2, false, "step %d (generation %d): %d participants and %d stale in a world of %d", step, e.num("generation"), parts, stale, world)
		}
		idx := make([][]int, world)
		shards := make([]worker.Fingerprint, world)
		var next worker.Position
		for r := range world {
			if idx[r], _, next, err = s.Batch(pos, c.batch, world, r, nil); err != nil {
				return verdict(2, false, "the sampler at step %d: %v", step, err)
			}
			shards[r] = worker.FingerprintOf(idx[r])
		}
		got := eventFingerprint(e)
		lost, ok := participantsOf(got, shards, parts)
		if !ok {
			return verdict(2, false, "step %d (generation %d, world %d, %d participants): %s", step, e.num("generation"), world, parts, explainBatch(got, shards, idx, parts))
		}
		if lost != (worker.Fingerprint{}) {
			dropped++
		}
		if e.num("epoch") != next.Epoch || e.num("offset") != next.Offset {
			return verdict(2, false, "step %d ended at sampler position %d/%d, want %d/%d", step, e.num("epoch"), e.num("offset"), next.Epoch, next.Offset)
		}
		add(&epochSum, got)
		add(&epochSum, lost)
		if next.Epoch != pos.Epoch { // the epoch is over: every index once
			if epochSum != full {
				return verdict(2, false, "epoch %d (steps up to %d): the samples trained or recorded dropped have fingerprint %v; the dataset's %d indices have %v: %s",
					pos.Epoch, step, epochSum, c.samples, full, explainEpoch(epochSum, full))
			}
			epochs++
			epochSum = worker.Fingerprint{}
		}
		pos = next
	}
	if epochSum[0] != float64(pos.Offset) {
		return verdict(2, false, "epoch %d: %v samples trained or recorded dropped by its offset %d", pos.Epoch, epochSum[0], pos.Offset)
	}
	extra := ""
	if dropped > 0 {
		extra = fmt.Sprintf("; %d steps recorded stale ranks' samples as dropped", dropped)
	}
	return verdict(2, true, "steps 1..%d each trained once, each on exactly the sampler's global batch; each of %d whole epochs trained (or recorded dropped) every one of the %d indices exactly once; epoch %d at %d%s",
		c.total, epochs, c.samples, pos.Epoch, pos.Offset, extra)
}

// wholeSet is the fingerprint of the indices 0..n−1.
func wholeSet(n int) worker.Fingerprint {
	var f worker.Fingerprint
	one := make([]int, 1)
	for i := range n {
		one[0] = i
		add(&f, worker.FingerprintOf(one))
	}
	return f
}

func add(dst *worker.Fingerprint, f worker.Fingerprint) {
	for k := range dst {
		dst[k] += f[k]
	}
}

func eventFingerprint(e Event) worker.Fingerprint {
	var got worker.Fingerprint
	fp, _ := e.Fields["fingerprint"].([]any)
	for k := range min(len(fp), len(got)) {
		got[k], _ = fp[k].(float64)
	}
	return got
}

// participantsOf finds parts of the shards whose fingerprints sum to got,
// and returns the sum of the others: the samples dropped with the stale
// ranks.
func participantsOf(got worker.Fingerprint, shards []worker.Fingerprint, parts int) (lost worker.Fingerprint, ok bool) {
	world := len(shards)
	if world > 20 {
		var all worker.Fingerprint
		for _, s := range shards {
			add(&all, s)
		}
		return worker.Fingerprint{}, parts == world && got == all
	}
	for set := 0; set < 1<<world; set++ {
		var sum, rest worker.Fingerprint
		n := 0
		for r := range world {
			if set&(1<<r) == 0 {
				add(&rest, shards[r])
				continue
			}
			n++
			add(&sum, shards[r])
		}
		if n == parts && sum == got {
			return rest, true
		}
	}
	return worker.Fingerprint{}, false
}

// explainBatch says how a step's fingerprint differs from its global
// batch's: a rank's sample missing or trained twice when one explains it.
func explainBatch(got worker.Fingerprint, shards []worker.Fingerprint, idx [][]int, parts int) string {
	var all worker.Fingerprint
	for _, s := range shards {
		add(&all, s)
	}
	base := fmt.Sprintf("trained samples with fingerprint %v; the sampler's global batch has %v", got, all)
	if parts < len(shards) {
		return base + fmt.Sprintf(": not the shards of any %d of its ranks, so samples were lost beyond the stale ranks' recorded ones", parts)
	}
	if got[0] == all[0]-1 || got[0] == all[0] {
		one := make([]int, 1)
		for r, ix := range idx {
			var others worker.Fingerprint
			for q, s := range shards {
				if q != r {
					add(&others, s)
				}
			}
			for _, x := range ix {
				one[0] = x
				fx := worker.FingerprintOf(one)
				var skip worker.Fingerprint
				add(&skip, others)
				add(&skip, shards[r])
				for k := range skip {
					skip[k] -= fx[k]
				}
				if skip == got {
					return base + fmt.Sprintf(": rank %d's sample %d was not trained", r, x)
				}
				for _, y := range ix {
					one[0] = y
					fy := worker.FingerprintOf(one)
					dup := skip
					add(&dup, fy)
					if y != x && dup == got {
						return base + fmt.Sprintf(": rank %d trained sample %d twice and sample %d never", r, y, x)
					}
				}
			}
		}
	}
	if got[0] < all[0] {
		return base + fmt.Sprintf(": %v samples lost, none recorded as dropped", all[0]-got[0])
	}
	return base
}

// explainEpoch says how an epoch's samples differ from the dataset's.
func explainEpoch(got, full worker.Fingerprint) string {
	switch {
	case got[0] < full[0]:
		return fmt.Sprintf("%v samples never trained nor recorded dropped", full[0]-got[0])
	case got[0] > full[0]:
		return fmt.Sprintf("%v samples trained more than once", got[0]-full[0])
	}
	// One index twice and one never: the byte sums give their difference,
	// the hash sum tells the pair.
	d := got[1] + 256*got[2] + 65536*got[3] - (full[1] + 256*full[2] + 65536*full[3])
	n := int(full[0])
	one := make([]int, 1)
	var pairs []string
	for y := range n {
		x := y + int(d)
		if x < 0 || x >= n || x == y {
			continue
		}
		f := got
		one[0] = y
		add(&f, worker.FingerprintOf(one))
		one[0] = x
		fx := worker.FingerprintOf(one)
		for k := range f {
			f[k] -= fx[k]
		}
		if f == full {
			pairs = append(pairs, fmt.Sprintf("index %d trained twice and index %d never", x, y))
		}
	}
	if len(pairs) == 1 {
		return pairs[0]
	}
	if len(pairs) > 1 { // the fingerprint's five sums cannot tell them apart
		return fmt.Sprintf("as many samples as indices, but not each index once: one trained twice and one never (%d pairs of indices fit the difference), or more", len(pairs))
	}
	return "as many samples as indices, but not each index once: some trained twice and as many never"
}
