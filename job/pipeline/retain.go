package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/phalanx-rt/phalanx/checkpoint"
	"github.com/phalanx-rt/phalanx/job/logical"
)

// retention is the pipeline's checkpoint retention policy: which pipeline
// checkpoints (an index and the stage parts it names) to keep. It counts
// indexes, not stage parts: a stage's part is worth nothing without the
// index that ties it to the other stages' parts of its step, so the
// data-parallel checkpoint.Retention, which counts each prefix's
// checkpoints on their own, cannot be run on the stages' prefixes.
type retention struct {
	keepLast int // newest indexes kept (0: keep everything, retain does nothing)
	// keepEvery also keeps every keepEvery-th checkpoint (0: none), counted
	// by step rather than by a sequence number: an index has none, and a
	// step stays a multiple across restarts and reshapes of the job.
	keepEvery int
	every     int64 // the job's checkpoint period in steps (Checkpoint.EverySteps); with keepEvery, an index whose step is a multiple of keepEvery*every is kept
}

// milestone reports whether keepEvery keeps the checkpoint of step. Without
// a period in steps (a job checkpointing by time alone) there are none:
// its steps fall anywhere.
func (r retention) milestone(step int64) bool {
	if r.keepEvery <= 0 || r.every <= 0 {
		return false
	}
	if int64(r.keepEvery) > math.MaxInt64/r.every { // the period overflows: only step 0 is a multiple
		return step == 0
	}
	return step%(int64(r.keepEvery)*r.every) == 0
}

// stageDir is the directory, under "pipeline/", of one stage's checkpoints:
// p<P>-s<s>.
var stageDir = regexp.MustCompile(`^p[0-9]+-s[0-9]+$`)

// isStagePrefix reports whether prefix is a stage's, pipeline/p<P>-s<s>/:
// retain deletes no part anywhere else, whatever an index says.
func isStagePrefix(prefix string) bool {
	rest, ok := strings.CutPrefix(prefix, "pipeline/")
	if !ok {
		return false
	}
	dir, tail, ok := strings.Cut(rest, "/")
	return ok && tail == "" && stageDir.MatchString(dir)
}

// indexName is an index object's name as writeIndex makes it; its groups
// are its step and generation, which begin the IDs of the parts it names.
var indexName = regexp.MustCompile(`^` + regexp.QuoteMeta(logical.IndexPrefix) + `step-([0-9]{12})-g([0-9]+)-[0-9a-f]+\.json$`)

// partsOf is the beginning of the IDs of the stage parts an index named
// name names, as indexOf finds them ("" when the name is not an index's).
func partsOf(name string) string {
	m := indexName.FindStringSubmatch(name)
	if m == nil {
		return ""
	}
	step, err1 := strconv.ParseInt(m[1], 10, 64)
	gen, err2 := strconv.ParseUint(m[2], 10, 64)
	if err1 != nil || err2 != nil {
		return ""
	}
	return partPrefix(step, gen)
}

// retain deletes, from store, the pipeline checkpoints the policy does not
// keep, and returns the names of the indexes deleted, oldest first (stage
// parts deleted as orphans, named by no index, are not in the list).
//
// Indexes are the objects under indexPrefix with no further "/", sorted
// newest first by name, as newestIndex sorts them (the name sorts by step,
// then generation, then time). An index that does not decode is left
// alone and not counted: a person may want to look at it, and what cannot
// be read must not be deleted. Nor is any part whose ID starts with the
// step and generation in such an index's name: it may be what the index
// names, and indexOf can index it again.
//
// The newest keepLast decodable indexes are kept, and every one whose step
// is a multiple of keepEvery*every. Every other decodable index is deleted,
// oldest first (an interrupted retain leaves the newest checkpoints, as a
// complete run does), each before its parts, so that no index is ever
// left naming a part that is gone; then each of its parts that no
// remaining index names (an index re-indexing another's parts shares them).
// Parts outside pipeline/p<P>-s<s>/ are never deleted.
//
// Stage parts named by no index at all, left by a save that failed, was
// abandoned or was never indexed, are then deleted when their step is
// older than the newest kept index's, as the data-parallel retention
// deletes incomplete checkpoints older than the newest complete one: a
// newer one may be a save still in flight, whose index is yet to be
// written (saves are made one at a time, each after the one before was
// indexed or given up). With no decodable index, none
// is deleted. Every stage prefix found under "pipeline/" is searched, so
// that the parts of a job since reshaped (another P) go too.
//
// A failure stops retain: the error, wrapped, names what failed, and the
// names of the indexes deleted until then are returned with it. An index
// that cannot be read (unlike one that is read but does not decode) is a
// failure too, since its parts cannot be told apart from orphans. With
// keepLast <= 0, retain returns (nil, nil) and touches nothing.
func (r retention) retain(ctx context.Context, store checkpoint.Store) ([]string, error) {
	if r.keepLast <= 0 {
		return nil, nil
	}
	objs, err := store.List(ctx, logical.IndexPrefix)
	if err != nil {
		return nil, fmt.Errorf("pipeline checkpoint retention: list %s: %w", logical.IndexPrefix, err)
	}
	slices.SortFunc(objs, func(a, b checkpoint.ObjectInfo) int { return strings.Compare(b.Name, a.Name) })
	type entry struct {
		name string
		x    *logical.Index
	}
	var kept, doomed []entry
	var guarded []string // ID beginnings of parts an undecodable index may name
	n := 0               // decodable indexes, newest first
	for _, o := range objs {
		if strings.Contains(strings.TrimPrefix(o.Name, logical.IndexPrefix), "/") {
			continue
		}
		x, ok, err := logical.ReadIndex(ctx, store, o)
		switch {
		case errors.Is(err, checkpoint.ErrNotFound): // deleted since listed
			continue
		case err != nil:
			return nil, fmt.Errorf("pipeline checkpoint retention: read %s: %w", o.Name, err)
		case !ok:
			if g := partsOf(o.Name); g != "" {
				guarded = append(guarded, g)
			}
			continue
		}
		if n++; n <= r.keepLast || r.milestone(x.Step) {
			kept = append(kept, entry{o.Name, x})
		} else {
			doomed = append(doomed, entry{o.Name, x})
		}
	}
	guard := func(id string) bool {
		return slices.ContainsFunc(guarded, func(g string) bool { return strings.HasPrefix(id, g) })
	}

	// refs counts the indexes still in the store that name each part, by
	// prefix and ID; a part in it is named by some decodable index.
	refs := map[string]int{}
	for _, e := range append(slices.Clip(kept), doomed...) {
		for _, p := range distinctParts(e.x) {
			refs[p.Prefix+p.ID]++
		}
	}
	var deleted []string
	for i := len(doomed) - 1; i >= 0; i-- {
		e := doomed[i]
		if err := store.Delete(ctx, e.name); err != nil {
			return deleted, fmt.Errorf("pipeline checkpoint retention: delete %s: %w", e.name, err)
		}
		deleted = append(deleted, e.name)
		for _, p := range distinctParts(e.x) {
			k := p.Prefix + p.ID
			if refs[k]--; refs[k] > 0 || !isStagePrefix(p.Prefix) || guard(p.ID) {
				continue
			}
			if err := checkpoint.Remove(ctx, checkpoint.Prefixed(store, p.Prefix), p.ID); err != nil {
				return deleted, fmt.Errorf("pipeline checkpoint retention: delete part %s%s of %s: %w", p.Prefix, p.ID, e.name, err)
			}
		}
	}

	if len(kept) == 0 {
		return deleted, nil
	}
	newest := kept[0].x.Step // kept is newest first
	prefixes, err := stagePrefixes(ctx, store)
	if err != nil {
		return deleted, err
	}
	for _, prefix := range prefixes {
		ps := checkpoint.Prefixed(store, prefix)
		infos, err := checkpoint.List(ctx, ps)
		if err != nil {
			return deleted, fmt.Errorf("pipeline checkpoint retention: list %s: %w", prefix, err)
		}
		for _, in := range infos {
			if _, named := refs[prefix+in.ID]; named || in.Step >= newest || guard(in.ID) {
				continue
			}
			if err := checkpoint.Remove(ctx, ps, in.ID); err != nil {
				return deleted, fmt.Errorf("pipeline checkpoint retention: delete unindexed part %s%s: %w", prefix, in.ID, err)
			}
		}
	}
	return deleted, nil
}

// distinctParts are the parts x names, each once (by prefix and ID).
func distinctParts(x *logical.Index) []logical.Part {
	var out []logical.Part
	for _, p := range x.Parts {
		if !slices.ContainsFunc(out, func(q logical.Part) bool { return q.Prefix == p.Prefix && q.ID == p.ID }) {
			out = append(out, p)
		}
	}
	return out
}

// stagePrefixes are the distinct stage prefixes, pipeline/p<P>-s<s>/, that
// hold objects in store, sorted.
func stagePrefixes(ctx context.Context, store checkpoint.Store) ([]string, error) {
	objs, err := store.List(ctx, "pipeline/")
	if err != nil {
		return nil, fmt.Errorf("pipeline checkpoint retention: list pipeline/: %w", err)
	}
	var out []string
	for _, o := range objs {
		dir, _, ok := strings.Cut(strings.TrimPrefix(o.Name, "pipeline/"), "/")
		if p := "pipeline/" + dir + "/"; ok && stageDir.MatchString(dir) && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}
