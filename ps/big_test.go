package ps

import (
	"runtime"
	"testing"
)

// TestTenMillionRows: a sparse table of 10,000,000 rows × 64 float32s (the
// size the issue names) is created by pulls in batches of 4,096, takes
// pushes, and fits in memory: about 2.6 GB of rows and 0.6 GB of index.
func TestTenMillionRows(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("allocates 3 GB; run without -race and -short")
	}
	const n, dim, batch = 10_000_000, 64, 4096
	spec := TableSpec{ID: 1, Name: "big", Dim: dim, Init: InitUniform, InitScale: 0.01, Seed: 1, LR: 0.1}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	r := NewRows(spec)
	keys := make([]uint64, batch)
	out := make([]float32, batch*dim)
	for a := uint64(0); a < n; a += batch {
		keys = keys[:0]
		for k := a; k < min(a+batch, n); k++ {
			keys = append(keys, k*2654435761) // spread over the key space
		}
		r.Pull(keys, out[:len(keys)*dim])
	}
	if r.Len() != n {
		t.Fatalf("%d rows, want %d", r.Len(), n)
	}
	probe := []uint64{0, 5_000_000 * 2654435761, (n - 1) * 2654435761}
	before := make([]float32, len(probe)*dim)
	r.Pull(probe, before)
	grads := make([]float32, len(probe)*dim)
	for i := range grads {
		grads[i] = 1
	}
	r.Apply(probe, grads, 1)
	after := make([]float32, len(probe)*dim)
	r.Pull(probe, after)
	for i := range after {
		if d := before[i] - after[i]; d < 0.0999 || d > 0.1001 {
			t.Fatalf("value %d moved by %v, want 0.1", i, d)
		}
	}
	if r.Len() != n {
		t.Fatalf("pulls of existing keys created rows: %d", r.Len())
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("%d rows × %d: heap %.2f GB", n, dim, float64(ms.HeapAlloc)/1e9)
	if ms.HeapAlloc > 4e9 {
		t.Errorf("heap %.2f GB for 2.56 GB of rows", float64(ms.HeapAlloc)/1e9)
	}
}
