package sparselr

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/ps"
)

func TestAUC(t *testing.T) {
	cases := []struct {
		scores []float32
		labels []bool
		want   float64
	}{
		{[]float32{0.1, 0.4, 0.35, 0.8}, []bool{false, false, true, true}, 0.75},
		{[]float32{1, 2, 3}, []bool{false, true, true}, 1},
		{[]float32{3, 2, 1}, []bool{false, true, true}, 0},
		{[]float32{0.5, 0.5, 0.5, 0.5}, []bool{false, true, false, true}, 0.5}, // ties count half
	}
	for _, tc := range cases {
		if got := AUC(tc.scores, tc.labels); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("AUC(%v, %v) = %v, want %v", tc.scores, tc.labels, got, tc.want)
		}
	}
	if !math.IsNaN(AUC([]float32{1, 2}, []bool{true, true})) {
		t.Error("AUC of one class")
	}
	if got := LogLoss([]float32{0.5, 0.5}, []bool{true, false}); math.Abs(got-math.Ln2) > 1e-9 {
		t.Errorf("LogLoss = %v, want ln 2", got)
	}
}

// TestGenerator: the log is a pure function of the seed and part; ids are
// distinct within an example and Zipf-distributed (id 0 the most common).
func TestGenerator(t *testing.T) {
	g, err := NewGenerator(Config{Seed: 3, IDs: 1000})
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := g.Draw(2000, 0), g.Draw(2000, 0), g.Draw(2000, 1)
	if !slices.Equal(a.IDs, b.IDs) || !slices.Equal(a.Clicked, b.Clicked) {
		t.Fatal("the same draw differs")
	}
	if slices.Equal(a.IDs, c.IDs) {
		t.Fatal("the held-out part equals the training part")
	}
	count := make([]int, 1000)
	for i := range a.Len() {
		ex := a.Example(i)
		for j, id := range ex {
			count[id]++
			if slices.Contains(ex[:j], id) {
				t.Fatalf("example %d repeats id %d", i, id)
			}
		}
	}
	if count[0] <= count[10] || count[10] <= count[500] {
		t.Errorf("ids not Zipf-like: counts of 0, 10, 500: %d %d %d", count[0], count[10], count[500])
	}
	if auc := BayesAUC(c); auc < 0.7 || auc > 0.95 {
		t.Errorf("the teacher's AUC %v", auc)
	}
	for _, bad := range []Config{{IDs: 1}, {Features: 2000}, {Zipf: -1}, {Sigma: math.Inf(1)}} {
		if _, err := NewGenerator(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestTrainsLocally: two epochs of 500,000 examples reach AUC 0.75 on the
// held-out log (the teacher allows about 0.82).
func TestTrainsLocally(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 2 epochs")
	}
	g, _ := NewGenerator(Config{Seed: 1})
	train, test := g.Draw(500_000, 0), g.Draw(50_000, 1)
	loc, err := NewLocal(Spec(g.Config().IDs, ps.Adagrad, 0.2))
	if err != nil {
		t.Fatal(err)
	}
	m := NewModel(loc, g.Config().IDs)
	// Local blocks on nothing; the bound is for a Params that would.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	idx := make([]int, 256)
	for range 2 {
		for a := 0; a+len(idx) <= train.Len(); a += len(idx) {
			for i := range idx {
				idx[i] = a + i
			}
			if _, _, err := m.Step(ctx, train, idx); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := make([]float32, test.Len())
	if err := m.Predict(ctx, test, 0, test.Len(), p); err != nil {
		t.Fatal(err)
	}
	auc, bayes := AUC(p, test.Clicked), BayesAUC(test)
	if auc < 0.75 {
		t.Errorf("AUC %.4f after 2 epochs, want at least 0.75 (the teacher's %.4f)", auc, bayes)
	}
	t.Logf("AUC %.4f, log-loss %.4f; the teacher's AUC %.4f", auc, LogLoss(p, test.Clicked), bayes)
}
