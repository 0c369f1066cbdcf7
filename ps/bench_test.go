package ps

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// BenchmarkPushPull: 2 workers pull then push 4,096 distinct keys of a
// 64-dim table over 2 shards on loopback; bytes are the row data moved.
func BenchmarkPushPull(b *testing.B) {
	const workers, keys, dim = 2, 4096, 64
	spec := TableSpec{ID: 1, Name: "emb", Dim: dim, KeySpace: 1 << 20, Init: InitUniform, InitScale: 0.01, LR: 0.01}
	c := newCluster(&testing.T{}, 2, 2, 0, []TableSpec{spec}, SyncSpec{Mode: ASP, Workers: workers})
	ctx := testContext(b)
	sets := make([][]uint64, 32)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range sets {
		perm := rng.Perm(1 << 20)[:keys]
		for _, p := range perm {
			sets[i] = append(sets[i], uint64(p))
		}
	}
	clients := []*Client{c.client(0, PartitionHash), c.client(1, PartitionHash)}
	vals, grads := make([][]float32, workers), make([]float32, keys*dim)
	for w := range vals {
		vals[w] = make([]float32, keys*dim)
	}
	b.SetBytes(2 * workers * keys * dim * 4)
	b.ResetTimer()
	for i := range b.N {
		var wg sync.WaitGroup
		for w, cl := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := sets[(i*workers+w)%len(sets)]
				if err := cl.Pull(ctx, 1, k, vals[w]); err != nil {
					b.Error(err)
				}
				if _, err := cl.Push(ctx, 1, k, grads); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait() // the pulls and pushes end with ctx
	}
}
