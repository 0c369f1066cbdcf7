package cut

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// mlp is k × (Dense+ReLU): fc1, relu1, …, fck, reluk, each Dense of
// dense parameters and each ReLU of none.
func mlp(k int, dense int64) []Layer {
	var ls []Layer
	for i := 1; i <= k; i++ {
		ls = append(ls, Layer{Name: fmt.Sprintf("fc%d", i), Params: dense, Cost: 2},
			Layer{Name: fmt.Sprintf("relu%d", i), Cost: 0.5})
	}
	return ls
}

// stageWeights sums weight over each stage of c, layer by layer.
func stageWeights(layers []Layer, c Cuts, weight func(Layer) float64) []float64 {
	var ws []float64
	for _, r := range c.Ranges(len(layers)) {
		var w float64
		for _, l := range layers[r[0]:r[1]] {
			w += weight(l)
		}
		ws = append(ws, w)
	}
	return ws
}

// brute enumerates every cut of layers into p stages in lexicographic
// order and returns the least heaviest stage and the last cut reaching it.
func brute(layers []Layer, p int, weight func(Layer) float64) (float64, Cuts) {
	best, bestCuts := math.Inf(1), Cuts(nil)
	var rec func(c Cuts)
	rec = func(c Cuts) {
		if len(c) == p-1 {
			if w := slices.Max(stageWeights(layers, c, weight)); w <= best {
				best, bestCuts = w, slices.Clone(c)
			}
			return
		}
		from := 1
		if len(c) > 0 {
			from = c[len(c)-1] + 1
		}
		for x := from; x <= len(layers)-(p-1-len(c)); x++ {
			rec(append(c, x))
		}
	}
	rec(Cuts{})
	return best, bestCuts
}

// checkCover fails unless c's ranges are non-empty and cover [0, n) in
// order.
func checkCover(t *testing.T, what string, c Cuts, n, p int) {
	t.Helper()
	r := c.Ranges(n)
	if len(r) != p {
		t.Fatalf("%s: %d ranges, want %d", what, len(r), p)
	}
	end := 0
	for s, x := range r {
		if x[0] != end || x[1] <= x[0] {
			t.Fatalf("%s: stage %d is %v after end %d: not contiguous or empty", what, s, x, end)
		}
		end = x[1]
	}
	if end != n {
		t.Fatalf("%s: ranges end at %d, want %d", what, end, n)
	}
}

// ByParams and ByCost reach brute force's least heaviest stage on many
// small random models; where the weights add up exactly (integers,
// multiples of 1/8) they pick brute force's latest optimal cut too.
func TestExactAgainstBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name   string
		by     func([]Layer, int) (Cuts, error)
		weight func(Layer) float64
		gen    func() Layer
		exact  bool // sums are exact: compare with == and the tie-break
	}{
		{"params", ByParams, Params, func() Layer {
			if rng.IntN(3) == 0 {
				return Layer{}
			}
			return Layer{Params: rng.Int64N(20)}
		}, true},
		{"cost/eighths", ByCost, Cost, func() Layer {
			if rng.IntN(4) == 0 {
				return Layer{}
			}
			return Layer{Cost: float64(rng.IntN(40)) / 8}
		}, true},
		{"cost/real", ByCost, Cost, func() Layer { return Layer{Cost: rng.ExpFloat64() * 1e-3} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for trial := range 3000 {
				n := 1 + rng.IntN(9)
				p := 1 + rng.IntN(min(4, n))
				layers := make([]Layer, n)
				for i := range layers {
					layers[i] = tc.gen()
					layers[i].Name = fmt.Sprintf("l%d", i)
				}
				what := fmt.Sprintf("trial %d: %v into %d", trial, stageWeights(layers, Cuts{}, tc.weight), p)
				c, err := tc.by(layers, p)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if err := Check(layers, c, p); err != nil {
					t.Fatalf("%s: cuts %v: %v", what, c, err)
				}
				checkCover(t, what, c, n, p)
				got := slices.Max(stageWeights(layers, c, tc.weight))
				want, wantCuts := brute(layers, p, tc.weight)
				if tc.exact && (got != want || !slices.Equal(c, wantCuts)) {
					t.Fatalf("%s: cuts %v, heaviest %v; brute force %v, heaviest %v", what, c, got, wantCuts, want)
				}
				if !tc.exact && math.Abs(got-want) > 1e-12*want {
					t.Fatalf("%s: cuts %v, heaviest %v; brute force %v, heaviest %v", what, c, got, want, wantCuts)
				}
			}
		})
	}
}

// dp is the O(p·n²) dynamic program over the same prefix-sum weights:
// the least heaviest stage of any cut of w into p stages.
func dp[T int64 | float64](w []T, p int) T {
	n := len(w)
	pre := make([]T, n+1)
	for i, x := range w {
		pre[i+1] = pre[i] + x
	}
	best := make([]T, n+1) // best[j]: layers [0, j) into k stages
	copy(best, pre)
	for k := 2; k <= p; k++ {
		next := make([]T, n+1)
		for j := k; j <= n; j++ {
			next[j] = max(best[k-1], pre[j]-pre[k-1])
			for i := k; i < j; i++ {
				next[j] = min(next[j], max(best[i], pre[j]-pre[i]))
			}
		}
		best = next
	}
	return best[n]
}

// On larger models, ByParams and ByCost reach the dynamic program's
// optimum exactly, floating-point costs included.
func TestExactAgainstDP(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 60 {
		n := 20 + rng.IntN(280)
		p := 1 + rng.IntN(16)
		layers := make([]Layer, n)
		params, costs := make([]int64, n), make([]float64, n)
		for i := range layers {
			if rng.IntN(3) > 0 {
				params[i] = rng.Int64N(1 << 30)
				costs[i] = rng.ExpFloat64()
			}
			layers[i] = Layer{Name: fmt.Sprintf("l%d", i), Params: params[i], Cost: costs[i]}
		}
		for _, tc := range []struct {
			name      string
			by        func([]Layer, int) (Cuts, error)
			got, want float64
		}{
			{name: "params", by: ByParams, want: float64(dp(params, p))},
			{name: "cost", by: ByCost, want: dp(costs, p)},
		} {
			c, err := tc.by(layers, p)
			if err != nil {
				t.Fatalf("trial %d %s: n=%d p=%d: %v", trial, tc.name, n, p, err)
			}
			checkCover(t, tc.name, c, n, p)
			var got float64
			for _, r := range c.Ranges(n) {
				if tc.name == "params" {
					var s int64
					for _, x := range params[r[0]:r[1]] {
						s += x
					}
					got = max(got, float64(s))
				} else {
					// The weight the package documents: the difference of
					// the rounded prefix sums.
					var a, b float64
					for _, x := range costs[:r[0]] {
						a += x
					}
					b = a
					for _, x := range costs[r[0]:r[1]] {
						b += x
					}
					got = max(got, b-a)
				}
			}
			if got != tc.want {
				t.Errorf("trial %d %s: n=%d p=%d: heaviest %v, dynamic program %v", trial, tc.name, n, p, got, tc.want)
			}
		}
	}
}

// Of the optimal cuts, the latest: each stage takes as many layers as the
// optimum allows.
func TestTies(t *testing.T) {
	for _, tc := range []struct {
		params []int64
		p      int
		want   Cuts
	}{
		{[]int64{5}, 1, Cuts{}},
		{[]int64{1, 2, 3, 4, 5}, 2, Cuts{3}},
		{[]int64{3, 3, 0, 3, 3}, 2, Cuts{3}},
		{[]int64{10, 0, 10, 0, 10, 0}, 3, Cuts{2, 4}},
		{[]int64{100, 1, 1, 1, 1, 1}, 3, Cuts{1, 5}},
		{[]int64{1, 1, 1, 1, 1, 100}, 3, Cuts{4, 5}},
		{[]int64{0, 0, 0, 0}, 2, Cuts{3}},
		{[]int64{0, 0, 0, 0}, 4, Cuts{1, 2, 3}},
		{[]int64{7, 7, 7, 7}, 4, Cuts{1, 2, 3}},
	} {
		layers := make([]Layer, len(tc.params))
		for i, x := range tc.params {
			layers[i] = Layer{Name: fmt.Sprintf("l%d", i), Params: x, Cost: float64(x)}
		}
		for name, by := range map[string]func([]Layer, int) (Cuts, error){"ByParams": ByParams, "ByCost": ByCost} {
			if c, err := by(layers, tc.p); err != nil || !slices.Equal(c, tc.want) {
				t.Errorf("%s(%v, %d) = %v, %v; want %v", name, tc.params, tc.p, c, err, tc.want)
			}
		}
	}
}

// ByCost's optimum is exact to the last bit: where a later cut is worse
// by a hair, it is not taken, as a bound found to a tolerance would.
func TestCostNearTies(t *testing.T) {
	for _, tc := range []struct {
		costs []float64
		p     int
		want  Cuts
	}{
		// [1+ε | 2ε, 1] weighs 1+2ε at most, [1+ε, 2ε | 1] 1+3ε.
		{[]float64{1 + 0x1p-45, 0x1p-44, 1}, 2, Cuts{1}},
		{[]float64{1 + 0x1p-50, 0x1p-49, 1}, 2, Cuts{1}},
		{[]float64{1e6 + 0x1p-30, 0x1p-29, 1e6, 1e6}, 3, Cuts{1, 3}},
		// A true tie: the later cut.
		{[]float64{1, 0x1p-40, 1}, 2, Cuts{2}},
	} {
		layers := make([]Layer, len(tc.costs))
		for i, x := range tc.costs {
			layers[i] = Layer{Name: fmt.Sprintf("l%d", i), Cost: x}
		}
		if c, err := ByCost(layers, tc.p); err != nil || !slices.Equal(c, tc.want) {
			t.Errorf("ByCost(%v, %d) = %v, %v; want %v", tc.costs, tc.p, c, err, tc.want)
		}
	}
}

// 16 × (Dense 1024×1024+1024, ReLU) cut by parameters gives every stage
// the same parameters, each stage ending with a ReLU.
func TestDenseReLU(t *testing.T) {
	const dense = 1024*1024 + 1024
	layers := mlp(16, dense)
	for _, tc := range []struct {
		p    int
		want Cuts
	}{
		{1, Cuts{}},
		{2, Cuts{16}},
		{4, Cuts{8, 16, 24}},
		{8, Cuts{4, 8, 12, 16, 20, 24, 28}},
	} {
		c, err := ByParams(layers, tc.p)
		if err != nil {
			t.Fatalf("%d stages: %v", tc.p, err)
		}
		for s, w := range stageWeights(layers, c, Params) {
			if w != 16/float64(tc.p)*dense {
				t.Errorf("%d stages: cuts %v: stage %d has %v parameters, want %v", tc.p, c, s, w, 16/float64(tc.p)*dense)
			}
		}
		if !slices.Equal(c, tc.want) {
			t.Errorf("%d stages: cuts %v, want %v", tc.p, c, tc.want)
		}
		if im := Imbalance(layers, c, Params); im != 1 {
			t.Errorf("%d stages: Imbalance = %v, want 1", tc.p, im)
		}
	}
}

func TestRanges(t *testing.T) {
	for _, tc := range []struct {
		c    Cuts
		n    int
		want [][2]int
	}{
		{nil, 3, [][2]int{{0, 3}}},
		{Cuts{1}, 2, [][2]int{{0, 1}, {1, 2}}},
		{Cuts{2, 5}, 7, [][2]int{{0, 2}, {2, 5}, {5, 7}}},
	} {
		if got := tc.c.Ranges(tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("%v.Ranges(%d) = %v, want %v", tc.c, tc.n, got, tc.want)
		}
	}
}

// Check's errors name the cut, its layer and the stage at fault.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		layers []Layer
		cuts   Cuts
		stages int
		want   string // "" for valid
	}{
		{mlp(10, 1), Cuts{5, 12}, 3, ""},
		{mlp(10, 1), nil, 1, ""},
		{mlp(10, 1), Cuts{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 20, ""},
		{mlp(10, 1), Cuts{5, 20}, 3, `pipeline cut: cut 2 at layer 20 is past the model's last layer (19, "relu10")`},
		{mlp(10, 1), Cuts{5, 25}, 3, `cut 2 at layer 25 is past the model's last layer (19, "relu10")`},
		{mlp(10, 1), Cuts{3, 6, 6}, 4, `pipeline cut: stage 2 would be empty (cut 3 at layer 6 ("fc4") repeats cut 2)`},
		{mlp(10, 1), Cuts{6, 5}, 3, `pipeline cut: stage 1 would be empty (cut 2 at layer 5 ("relu3") is not after cut 1 at layer 6 ("fc4"))`},
		{mlp(10, 1), Cuts{0, 4}, 3, `pipeline cut: stage 0 would be empty (cut 1 at layer 0 ("fc1");`},
		{mlp(10, 1), Cuts{-1}, 2, `pipeline cut: cut 1 at layer -1 is before the model's first layer (0, "fc1")`},
		{mlp(10, 1), Cuts{2, 4, 6}, 2, `pipeline cut: 3 cut points make 4 stages, want 2 stages`},
		{mlp(10, 1), nil, 2, `pipeline cut: 0 cut points make 1 stage, want 2 stages`},
		{mlp(3, 1)[:5], Cuts{1, 2, 3, 4, 5, 6, 7}, 8, `pipeline cut: 8 stages for a model of 5 layers ("fc1" ... "fc3")`},
		{mlp(3, 1)[:1], Cuts{1}, 2, `pipeline cut: 2 stages for a model of 1 layer ("fc1")`},
		{mlp(3, 1), nil, 0, `pipeline cut: 0 stages, want ≥ 1`},
		{nil, nil, 1, `pipeline cut: the model has no layers`},
	} {
		err := Check(tc.layers, tc.cuts, tc.stages)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Check(%d layers, %v, %d) = %v, want nil", len(tc.layers), tc.cuts, tc.stages, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Check(%d layers, %v, %d) = %v, want an error containing %q", len(tc.layers), tc.cuts, tc.stages, err, tc.want)
		}
	}
}

// ByParams and ByCost refuse what cannot be cut, naming the problem; each
// checks only the weight it balances by.
func TestBadInputs(t *testing.T) {
	bad := func(f func(l []Layer)) []Layer {
		ls := mlp(3, 10)
		f(ls)
		return ls
	}
	for _, tc := range []struct {
		name   string
		by     func([]Layer, int) (Cuts, error)
		layers []Layer
		stages int
		want   string // "" for valid
	}{
		{"ByParams", ByParams, nil, 1, "pipeline cut: the model has no layers"},
		{"ByCost", ByCost, []Layer{}, 1, "pipeline cut: the model has no layers"},
		{"ByParams", ByParams, mlp(3, 10), 0, "pipeline cut: 0 stages, want ≥ 1"},
		{"ByCost", ByCost, mlp(3, 10), -2, "pipeline cut: -2 stages, want ≥ 1"},
		{"ByParams", ByParams, mlp(3, 10), 7, `pipeline cut: 7 stages for a model of 6 layers ("fc1" ... "relu3")`},
		{"ByCost", ByCost, mlp(3, 10), 7, `pipeline cut: 7 stages for a model of 6 layers ("fc1" ... "relu3")`},
		{"ByParams", ByParams, bad(func(l []Layer) { l[3].Params = -4 }), 2, `pipeline cut: layer 3 ("relu2") has -4 parameters, want ≥ 0`},
		{"ByParams", ByParams, bad(func(l []Layer) { l[0].Params, l[2].Params = math.MaxInt64, 1 }), 2, "pipeline cut: the parameters of layers 0 to 2 overflow int64"},
		{"ByCost", ByCost, bad(func(l []Layer) { l[2].Cost = math.NaN() }), 2, `pipeline cut: layer 2 ("fc2") has cost NaN, want a finite number ≥ 0`},
		{"ByCost", ByCost, bad(func(l []Layer) { l[1].Cost = -0.5 }), 2, `pipeline cut: layer 1 ("relu1") has cost -0.5, want a finite number ≥ 0`},
		{"ByCost", ByCost, bad(func(l []Layer) { l[4].Cost = math.Inf(1) }), 2, `pipeline cut: layer 4 ("fc3") has cost +Inf, want a finite number ≥ 0`},
		{"ByCost", ByCost, bad(func(l []Layer) { l[0].Cost, l[1].Cost = math.MaxFloat64, math.MaxFloat64 }), 2, "pipeline cut: the costs of layers 0 to 1 sum to +Inf"},
		{"ByParams", ByParams, bad(func(l []Layer) { l[2].Cost = math.NaN() }), 2, ""},
		{"ByCost", ByCost, bad(func(l []Layer) { l[2].Params = -1 }), 2, ""},
	} {
		c, err := tc.by(tc.layers, tc.stages)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s(%d layers, %d): %v, want no error", tc.name, len(tc.layers), tc.stages, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s(%d layers, %d) = %v, %v; want an error containing %q", tc.name, len(tc.layers), tc.stages, c, err, tc.want)
		}
	}
}

func TestParse(t *testing.T) {
	six := mlp(3, 1) // fc1 relu1 fc2 relu2 fc3 relu3
	dup := []Layer{{Name: "a"}, {Name: "b"}, {Name: "a"}}
	for _, tc := range []struct {
		s      string
		layers []Layer
		want   Cuts
		err    string // "" for no error
	}{
		{"2,4", six, Cuts{2, 4}, ""},
		{" 2 , 4 ", six, Cuts{2, 4}, ""},
		{"fc2,fc3", six, Cuts{2, 4}, ""},
		{"relu1, 4", six, Cuts{1, 4}, ""},
		{"+3", six, Cuts{3}, ""},
		{"99", six, Cuts{99}, ""}, // range is Check's
		{"", six, nil, ""},
		{"  ", six, nil, ""},
		{"b", dup, Cuts{1}, ""},
		{"2,,4", six, nil, "pipeline cut: item 2 is empty"},
		{"2,", six, nil, "pipeline cut: item 2 is empty"},
		{"fc9", six, nil, `pipeline cut: item 1, "fc9", is not a layer name (the model has 6 layers ("fc1" ... "relu3"))`},
		{"fc2,FC3", six, nil, `pipeline cut: item 2, "FC3", is not a layer name`},
		{"4.5", six, nil, `pipeline cut: item 1, "4.5", is not a number (a layer index) nor a layer name`},
		{"2,4x", six, nil, `pipeline cut: item 2, "4x", is not a number`},
		{"99999999999999999999999", six, nil, `item 1, "99999999999999999999999", is not a number`},
		{"2,-3", six, nil, "pipeline cut: item 2, -3, is negative; layers are numbered from 0"},
		{"a", dup, nil, `pipeline cut: item 1, "a", names layers 0 and 2`},
		{"x", nil, nil, `item 1, "x", is not a layer name (the model has 0 layers (none))`},
	} {
		c, err := Parse(tc.s, tc.layers)
		switch {
		case tc.err == "" && (err != nil || !slices.Equal(c, tc.want)):
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.s, c, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Parse(%q) = %v, %v; want an error containing %q", tc.s, c, err, tc.err)
		}
	}
	if _, err := Parse("4.5", six); !errors.Is(err, strconv.ErrSyntax) {
		t.Errorf("Parse(4.5): %v does not wrap strconv.ErrSyntax", err)
	}
}

func TestImbalance(t *testing.T) {
	two := mlp(2, 10) // fc1 relu1 fc2 relu2; params 10 0 10 0, cost 2 .5 2 .5
	for _, tc := range []struct {
		layers []Layer
		c      Cuts
		weight func(Layer) float64
		want   float64
	}{
		{two, Cuts{2}, Params, 1},
		{two, Cuts{1}, Params, 1},
		{two, Cuts{3}, Params, 2},             // 20, 0
		{two, Cuts{1, 2}, Params, 1.5},        // 10, 0, 10 over a mean of 20/3
		{two, Cuts{1, 2, 3}, Params, 2},       // 10, 0, 10, 0
		{two, Cuts{1}, Cost, 3 / 2.5},         // 2, 3 over a mean of 2.5
		{two, nil, Cost, 1},                   // one stage
		{mlp(2, 0), Cuts{1}, Params, 1},       // nothing to balance
		{two, Cuts{3, 1}, Params, math.NaN()}, // not valid cuts
	} {
		got := Imbalance(tc.layers, tc.c, tc.weight)
		if got != tc.want && !(math.IsNaN(got) && math.IsNaN(tc.want)) {
			t.Errorf("Imbalance(%v, %v) = %v, want %v", tc.layers, tc.c, got, tc.want)
		}
	}
}

// Cutting 16 × (Dense+ReLU) into 4 stages by parameters: four of each.
func ExampleByParams() {
	layers := mlp(16, 1024*1024+1024)
	c, _ := ByParams(layers, 4)
	for s, r := range c.Ranges(len(layers)) {
		fmt.Printf("stage %d: %s ... %s\n", s, layers[r[0]].Name, layers[r[1]-1].Name)
	}
	// Output:
	// stage 0: fc1 ... relu4
	// stage 1: fc5 ... relu8
	// stage 2: fc9 ... relu12
	// stage 3: fc13 ... relu16
}
