package collective

import (
	"fmt"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/internal/testwait"
)

// BenchmarkAllReduce measures steady-state allreduce over in-process ranks;
// -benchmem shows the allocations per operation (zero is the requirement).
func BenchmarkAllReduce(b *testing.B) {
	for _, algo := range []Algorithm{AlgoRing, AlgoRecursiveDoubling} {
		for _, size := range []int{4 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%dB", algo, size), func(b *testing.B) {
				groups := inprocGroups(b, 4, 1, Options{})
				bufs := make([][]float32, len(groups))
				for r := range bufs {
					bufs[r] = make([]float32, size/4)
				}
				ctx := testContext(b)
				start := make([]chan struct{}, len(groups))
				done := make(chan error, len(groups))
				for r := 1; r < len(groups); r++ {
					start[r] = make(chan struct{}, 1)
					go func() {
						for range start[r] {
							done <- groups[r].AllReduceWith(ctx, Float32s(bufs[r]), Sum, algo)
						}
					}()
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					for r := 1; r < len(groups); r++ {
						start[r] <- struct{}{}
					}
					if err := groups[0].AllReduceWith(ctx, Float32s(bufs[0]), Sum, algo); err != nil {
						b.Fatal(err)
					}
					for r := 1; r < len(groups); r++ {
						if err := testwait.Recv(b, done, time.Minute, "a rank's allreduce"); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				for r := 1; r < len(groups); r++ {
					close(start[r])
				}
			})
		}
	}
}
