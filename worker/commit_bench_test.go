package worker

import (
	"testing"

	"github.com/phalanx-rt/phalanx/nn"
)

// BenchmarkCommit is the cost of an in-memory commit of the example MLP
// (784-512-512-10) with momentum: what committing every step adds to a step.
func BenchmarkCommit(b *testing.B) {
	var params []*nn.Param
	for i, n := range []int{784 * 512, 512, 512 * 512, 512, 512 * 10, 10} {
		params = append(params, &nn.Param{Name: string(rune('a' + i)), Value: make([]float32, n), Grad: make([]float32, n)})
	}
	opt, err := nn.NewOptimizer(nn.OptimizerConfig{Kind: "momentum", Momentum: 0.9}, params)
	if err != nil {
		b.Fatal(err)
	}
	s := NewState(params, opt)
	b.SetBytes(int64(2 * 4 * (784*512 + 512 + 512*512 + 512 + 512*10 + 10)))
	b.ResetTimer()
	for range b.N {
		s.Commit()
	}
}
