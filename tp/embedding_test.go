package tp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/nn"
)

// TestVocabParallelEmbeddingEqualsWhole: at T = 1, 2 and 4 over a
// vocabulary of 7 (cut unevenly), every rank's looked-up rows equal the
// whole table's, bit for bit (one rank adds its row to zeros), and each
// rank's rows of the table's gradient equal the whole gradient's rows,
// repeated ids included; an id outside the vocabulary is refused.
func TestVocabParallelEmbeddingEqualsWhole(t *testing.T) {
	const vocab, dim = 7, 3
	ids := []int32{6, 0, 3, 3, 5, 1}
	full := nn.NewEmbedding("emb", vocab, dim, rand.New(rand.NewPCG(4, 4)))
	want, err := full.Lookup(ids)
	if err != nil {
		t.Fatal(err)
	}
	wantY := slices.Clone(want.Data)
	dy := randMatrix(5, len(ids), dim)
	full.Backward(dy)
	for _, size := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			gs := groups(t, ctx, size)
			var wg sync.WaitGroup
			for r, g := range gs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					e := NewVocabParallelEmbedding(NewComm(ctx, g), nn.NewEmbedding("emb", vocab, dim, rand.New(rand.NewPCG(4, 4))))
					if _, err := e.Lookup([]int32{7}); err == nil || !strings.Contains(err.Error(), "id 7") {
						t.Errorf("rank %d: id 7 of 7: %v", r, err)
					}
					if _, err := e.Lookup([]int32{2, 4, 2, 0, 6, 2}); err != nil { // the buffers then hold other rows
						t.Errorf("rank %d: %v", r, err)
						return
					}
					y, err := e.Lookup(ids)
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
						return
					}
					if !slices.Equal(y.Data, wantY) {
						t.Errorf("rank %d: rows %v, want %v", r, y.Data, wantY)
					}
					e.Backward(dy)
					lo, hi := e.Range()
					if !slices.Equal(e.Table.Grad, full.Table.Grad[lo*dim:hi*dim]) {
						t.Errorf("rank %d: gradient rows %d..%d %v, want %v", r, lo, hi, e.Table.Grad, full.Table.Grad[lo*dim:hi*dim])
					}
				}()
			}
			wg.Wait()
		})
	}
}
