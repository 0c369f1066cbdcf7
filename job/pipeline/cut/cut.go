// Package cut divides a model's ordered layers into a pipeline's stages:
// balanced by parameter count or by measured time, or at cut points a
// person gives. Each stage is a run of consecutive layers and none is
// empty. Nothing here does I/O.
//
// ByParams and ByCost solve the min-max linear partition exactly: of all
// ways to cut n layers into P non-empty runs, they return one whose
// heaviest stage is as light as possible, and of those the one whose cut
// points come latest (the lexicographically greatest Cuts): each stage in
// turn takes as many layers as the optimum allows, so a layer that weighs
// nothing, like the ReLU after a Dense, stays in the stage of the layer
// before it. A stage's weight is pre[end] − pre[start] over the prefix
// sums pre of the layers' weights: exact for parameter counts, and for
// costs the floating-point sums as the prefix sums round them. The
// optimum is found by binary search on the answer — over the integers for
// parameters, over the bit patterns of the non-negative float64s for
// costs, so no tolerance is involved — with a greedy check of whether P
// stages under a bound suffice: O(64·n) time, O(n) space.
//
// Check validates cut points a person gives, Parse reads them from a
// --pp-cuts value, and Imbalance says how even a cut is. Every error
// starts with "pipeline cut: " and names the layers, stages or items at
// fault.
package cut

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Layer is one layer of a model as the cut sees it.
type Layer struct {
	Name   string  // as messages name it, e.g. "fc3" or "relu3"
	Params int64   // parameter count, ≥ 0
	Cost   float64 // measured forward+backward seconds (or any unit), finite and ≥ 0
}

// Cuts are the first layer index of stages 1..P-1 (stage 0 starts at
// layer 0): len == P-1, strictly increasing, each in [1, n-1] for n
// layers. Check says whether they are.
type Cuts []int

// Ranges returns the [start, end) layer range of each stage for n layers:
// [0, c[0]), [c[0], c[1]), …, [c[P-2], n). It does not validate c; for
// cuts that pass Check the ranges are non-empty and cover [0, n) in order.
func (c Cuts) Ranges(n int) [][2]int {
	r := make([][2]int, len(c)+1)
	start := 0
	for i, x := range c {
		r[i] = [2]int{start, x}
		start = x
	}
	r[len(c)] = [2]int{start, n}
	return r
}

// ByParams cuts layers into stages non-empty stages minimising the
// largest stage's parameter count; of the optimal cuts it returns the one
// with the latest cut points (see the package doc). A layer without parameters weighs 0 but
// still counts as a layer of its stage. It returns an error when layers
// is empty, stages is not in [1, len(layers)], a layer's Params is
// negative or the total overflows int64.
func ByParams(layers []Layer, stages int) (Cuts, error) {
	if err := checkShape(layers, stages); err != nil {
		return nil, err
	}
	pre := make([]int64, len(layers)+1)
	for i, l := range layers {
		if l.Params < 0 {
			return nil, fmt.Errorf("pipeline cut: %s has %d parameters, want ≥ 0", at(layers, i), l.Params)
		}
		if pre[i] > math.MaxInt64-l.Params {
			return nil, fmt.Errorf("pipeline cut: the parameters of layers 0 to %d overflow int64", i)
		}
		pre[i+1] = pre[i] + l.Params
	}
	return partition(pre, stages, func(fits func(int64) bool) int64 {
		lo, hi := int64(0), pre[len(layers)] // fits(hi): one stage of everything
		for lo < hi {
			mid := lo + (hi-lo)/2
			if fits(mid) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return lo
	}), nil
}

// ByCost is ByParams with the layers' Cost as their weight. It returns an
// error when a layer's Cost is negative, NaN or infinite, or the total is
// not finite.
func ByCost(layers []Layer, stages int) (Cuts, error) {
	if err := checkShape(layers, stages); err != nil {
		return nil, err
	}
	pre := make([]float64, len(layers)+1)
	for i, l := range layers {
		if math.IsNaN(l.Cost) || math.IsInf(l.Cost, 0) || l.Cost < 0 {
			return nil, fmt.Errorf("pipeline cut: %s has cost %v, want a finite number ≥ 0", at(layers, i), l.Cost)
		}
		pre[i+1] = pre[i] + l.Cost
		if math.IsInf(pre[i+1], 0) {
			return nil, fmt.Errorf("pipeline cut: the costs of layers 0 to %d sum to %v", i, pre[i+1])
		}
	}
	return partition(pre, stages, func(fits func(float64) bool) float64 {
		// Non-negative float64s order as their bit patterns do, so the
		// least bound that fits is found exactly among them.
		lo, hi := uint64(0), math.Float64bits(pre[len(layers)])
		for lo < hi {
			mid := lo + (hi-lo)/2
			if fits(math.Float64frombits(mid)) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return math.Float64frombits(lo)
	}), nil
}

// partition cuts the n = len(pre)-1 layers with prefix weights pre
// (non-decreasing, pre[0] = 0) into p non-empty stages, 1 ≤ p ≤ n:
// least finds the least bound under which fits holds, the optimum; the
// cuts are then the latest whose stages all weigh at most it.
func partition[T int64 | float64](pre []T, p int, least func(fits func(T) bool) T) Cuts {
	n := len(pre) - 1
	// fits: do p stages of weight ≤ bound suffice? Greedily give each
	// stage as many layers as the bound allows; that needs the fewest
	// stages, and p ≥ the fewest suffices, since a stage of several
	// layers splits into lighter ones (p ≤ n). The weight pre[j]−pre[i]
	// grows with j and shrinks with i, in floating point too, so the
	// greedy argument holds exactly for the rounded sums.
	fits := func(bound T) bool {
		stages := 0
		for i := 0; i < n; {
			if pre[i+1]-pre[i] > bound {
				return false
			}
			j := i + 1
			for j < n && pre[j+1]-pre[i] <= bound {
				j++
			}
			if stages++; stages > p {
				return false
			}
			i = j
		}
		return true
	}
	bound := least(fits)
	// The latest cuts: each stage takes as many layers as the bound
	// allows while leaving one for each stage after it. What is left then
	// still fits: the layers from a later cut need no more stages than
	// those from an earlier one, and some cut up to this one worked.
	cuts := make(Cuts, 0, p-1)
	for s, start := 1, 0; s < p; s++ {
		j := start + 1
		for j < n-(p-s) && pre[j+1]-pre[start] <= bound {
			j++
		}
		cuts = append(cuts, j)
		start = j
	}
	return cuts
}

// Check validates explicit cut points for layers and stages: stages in
// [1, len(layers)], len(cuts) = stages−1, and each cut in [1, n−1] and
// after the one before. The error names the cut, its layer and the stage
// it would leave empty.
func Check(layers []Layer, cuts Cuts, stages int) error {
	if err := checkShape(layers, stages); err != nil {
		return err
	}
	n := len(layers)
	if len(cuts) != stages-1 {
		return fmt.Errorf("pipeline cut: %s make %s, want %s", plural(len(cuts), "cut point"), plural(len(cuts)+1, "stage"), plural(stages, "stage"))
	}
	for k, c := range cuts {
		switch {
		case c < 0:
			return fmt.Errorf("pipeline cut: cut %d at layer %d is before the model's first layer (0, %q)", k+1, c, layers[0].Name)
		case c == 0:
			return fmt.Errorf("pipeline cut: stage 0 would be empty (cut %d at layer 0 (%q); stage 0 starts at layer 0, so cuts start at layer 1)", k+1, layers[0].Name)
		case c >= n:
			return fmt.Errorf("pipeline cut: cut %d at layer %d is past the model's last layer (%d, %q)", k+1, c, n-1, layers[n-1].Name)
		case k > 0 && c == cuts[k-1]:
			return fmt.Errorf("pipeline cut: stage %d would be empty (cut %d at %s repeats cut %d)", k, k+1, at(layers, c), k)
		case k > 0 && c < cuts[k-1]:
			return fmt.Errorf("pipeline cut: stage %d would be empty (cut %d at %s is not after cut %d at %s)", k, k+1, at(layers, c), k, at(layers, cuts[k-1]))
		}
	}
	return nil
}

// Parse reads a --pp-cuts value: comma-separated layer indices ("4,8,12")
// or layer names ("fc5,fc9"), which may be mixed; each is the first layer
// of a stage after stage 0. An item in integer syntax is an index, any
// other a name resolved against layers. Spaces around items are ignored;
// an empty or blank s gives no cuts. Parse checks neither the indices'
// range nor their order (Check does, knowing the stages); its errors name
// the bad item: empty, negative, not a number, an unknown name, or a name
// two layers share.
func Parse(s string, layers []Layer) (Cuts, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	items := strings.Split(s, ",")
	cuts := make(Cuts, 0, len(items))
	for k, raw := range items {
		item := strings.TrimSpace(raw)
		if item == "" {
			return nil, fmt.Errorf("pipeline cut: item %d is empty", k+1)
		}
		i, err := strconv.Atoi(item)
		switch found := find(layers, item); {
		case err == nil && i < 0:
			return nil, fmt.Errorf("pipeline cut: item %d, %s, is negative; layers are numbered from 0", k+1, item)
		case err == nil:
			cuts = append(cuts, i)
		case len(found) == 1:
			cuts = append(cuts, found[0])
		case len(found) > 1:
			return nil, fmt.Errorf("pipeline cut: item %d, %q, names layers %d and %d", k+1, item, found[0], found[1])
		case isNumeric(item):
			return nil, fmt.Errorf("pipeline cut: item %d, %q, is not a number (a layer index) nor a layer name: %w", k+1, item, err)
		default:
			return nil, fmt.Errorf("pipeline cut: item %d, %q, is not a layer name (the model has %s %s)", k+1, item, plural(len(layers), "layer"), span(layers))
		}
	}
	return cuts, nil
}

// Imbalance says how even a cut is: the heaviest stage's weight over the
// mean stage weight, 1 for a perfect balance and P at worst; weight gives
// each layer's weight (e.g. its Params or Cost), summed per stage. It is 1
// when every weight is 0, and NaN when c does not pass Check for len(c)+1
// stages.
func Imbalance(layers []Layer, c Cuts, weight func(Layer) float64) float64 {
	if Check(layers, c, len(c)+1) != nil {
		return math.NaN()
	}
	var total, heaviest float64
	for _, r := range c.Ranges(len(layers)) {
		var w float64
		for _, l := range layers[r[0]:r[1]] {
			w += weight(l)
		}
		total += w
		heaviest = max(heaviest, w)
	}
	if total == 0 {
		return 1
	}
	return heaviest / (total / float64(len(c)+1))
}

// Params is Layer.Params as a weight for Imbalance.
func Params(l Layer) float64 { return float64(l.Params) }

// Cost is Layer.Cost as a weight for Imbalance.
func Cost(l Layer) float64 { return l.Cost }

// checkShape validates layers and stages against each other.
func checkShape(layers []Layer, stages int) error {
	switch {
	case len(layers) == 0:
		return fmt.Errorf("pipeline cut: the model has no layers")
	case stages < 1:
		return fmt.Errorf("pipeline cut: %d stages, want ≥ 1", stages)
	case stages > len(layers):
		return fmt.Errorf("pipeline cut: %d stages for a model of %s %s", stages, plural(len(layers), "layer"), span(layers))
	}
	return nil
}

// at names layer i: `layer 6 ("relu3")`.
func at(layers []Layer, i int) string {
	return fmt.Sprintf("layer %d (%q)", i, layers[i].Name)
}

// span names a model's layers by its first and last: `("fc1" ... "fc3")`.
func span(layers []Layer) string {
	switch len(layers) {
	case 0:
		return "(none)"
	case 1:
		return fmt.Sprintf("(%q)", layers[0].Name)
	}
	return fmt.Sprintf("(%q ... %q)", layers[0].Name, layers[len(layers)-1].Name)
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// find returns the indices of the layers named name.
func find(layers []Layer, name string) []int {
	var found []int
	for i, l := range layers {
		if l.Name == name {
			found = append(found, i)
		}
	}
	return found
}

// isNumeric says whether s looks meant as a number: it starts with a
// digit, a sign or a point.
func isNumeric(s string) bool {
	return strings.ContainsRune("0123456789+-.", rune(s[0]))
}
