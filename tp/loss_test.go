package tp

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/nn"
)

// TestVocabParallelLossEqualsWhole: at T = 1, 2 and 4 over a vocabulary
// of 7 (cut unevenly), each rank's loss sum and right answers equal
// nn.SoftmaxCrossEntropy's on the whole logits, and its gradient columns
// the whole gradient's, within 1e-5 relative; a tie for the largest logit
// counts as the first column's, as there.
func TestVocabParallelLossEqualsWhole(t *testing.T) {
	const rows, vocab = 6, 7
	logits := randMatrix(3, rows, vocab)
	for j := range vocab { // row 5: a tie between columns 2 and 5; its label 5 is not counted right
		logits.Data[5*vocab+j] = -1
	}
	logits.Data[5*vocab+2], logits.Data[5*vocab+5] = 4, 4
	labels := []int32{0, 6, 3, 3, 1, 5}
	labels[1] = int32(argmax(logits.Data[vocab : 2*vocab])) // one row right for sure
	var ref nn.SoftmaxCrossEntropy
	wantSum, wantCorrect, wantGrad, err := ref.Loss(logits, labels, 0.5)
	if err != nil {
		t.Fatal(err)
	}
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
					l := NewVocabParallelLoss(NewComm(ctx, g), vocab)
					lo, hi := l.Range()
					mine := nn.Matrix{Rows: rows, Cols: hi - lo, Data: colsOf(logits.Data, vocab, lo, hi)}
					sum, correct, grad, err := l.Loss(mine, labels, 0.5)
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
						return
					}
					if math.Abs(sum-wantSum) > 1e-5*math.Abs(wantSum) || correct != wantCorrect {
						t.Errorf("rank %d: loss %v, %d right; want %v, %d", r, sum, correct, wantSum, wantCorrect)
					}
					for i, v := range colsOf(wantGrad.Data, vocab, lo, hi) {
						if math.Abs(float64(grad.Data[i]-v)) > 1e-6 {
							t.Errorf("rank %d: gradient[%d] %v, want %v", r, i, grad.Data[i], v)
							return
						}
					}
				}()
			}
			wg.Wait()
		})
	}
	if wantCorrect < 1 || wantCorrect == rows {
		t.Fatalf("the reference counts %d of %d right: the test proves little", wantCorrect, rows)
	}
}

func argmax(x []float32) int {
	b := 0
	for j, v := range x {
		if v > x[b] {
			b = j
		}
	}
	return b
}

// TestVocabParallelLossBadInput: logits of another width and a label
// outside the vocabulary are errors naming them.
func TestVocabParallelLossBadInput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gs := groups(t, ctx, 1)
	l := NewVocabParallelLoss(NewComm(ctx, gs[0]), 4)
	if _, _, _, err := l.Loss(randMatrix(1, 2, 3), []int32{0, 1}, 1); err == nil || !strings.Contains(err.Error(), "3 logit columns") {
		t.Errorf("3 columns of 4: %v", err)
	}
	if _, _, _, err := l.Loss(randMatrix(1, 2, 4), []int32{0, 4}, 1); err == nil || !strings.Contains(err.Error(), "label 4") {
		t.Errorf("label 4 of 4: %v", err)
	}
}
