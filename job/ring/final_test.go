package ring

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/phalanx-rt/phalanx/checkpoint"
)

// TestFinalCheckpoint: a launcher says a stopped job has its final
// checkpoint only when the checkpoint of the stop step is complete in the
// store and its manifest matches its own checksum; otherwise it says which
// checkpoint a resume would take, or that there is none.
func TestFinalCheckpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	save := func(t *testing.T, dir string, steps ...int64) []string {
		t.Helper()
		store, err := checkpoint.NewLocalStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		c, err := checkpoint.New(checkpoint.Config{Store: store, Job: "final"},
			[]checkpoint.Tensor{{Name: "w", Shape: []int64{3}, Role: "parameter", Data: []float32{1, 2, 3}}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var ids []string
		for _, s := range steps {
			id, err := c.SaveAlone(ctx, checkpoint.Progress{Step: s}, 1)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) []string // the checkpoints' names
		want  string                                  // "": the stop step's checkpoint; else in the error
	}{
		{"the stop step's checkpoint complete", func(t *testing.T, dir string) []string { return save(t, dir, 100, 311) }, ""},
		{"an empty store", func(t *testing.T, dir string) []string { return nil }, "no complete checkpoint in"},
		{"only an older checkpoint", func(t *testing.T, dir string) []string { return save(t, dir, 100) },
			"no complete checkpoint of step 311 in .*; the newest is of step 100 .* trains steps 101..311 again"},
		{"the stop step's manifest missing", func(t *testing.T, dir string) []string {
			ids := save(t, dir, 100, 311)
			if err := os.Remove(filepath.Join(dir, ids[1], checkpoint.ManifestName)); err != nil {
				t.Fatal(err)
			}
			return ids
		}, "the newest is of step 100"},
		{"the stop step's manifest changed", func(t *testing.T, dir string) []string {
			ids := save(t, dir, 100, 311)
			p := filepath.Join(dir, ids[1], checkpoint.ManifestName)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			b[len(b)/2] ^= 1
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
			return ids
		}, "the newest is of step 100 .*refused: .*changed or damaged"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ids := tc.setup(t, dir)
			store, err := checkpoint.NewLocalStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			id, err := finalCheckpoint(ctx, store, 311)
			if tc.want == "" {
				if err != nil || id != ids[len(ids)-1] {
					t.Fatalf("got %q, %v; want %s", id, err, ids[len(ids)-1])
				}
				return
			}
			if err == nil || !regexp.MustCompile(tc.want).MatchString(err.Error()) {
				t.Fatalf("got %q, %v; want an error matching %q", id, err, tc.want)
			}
		})
	}
	if _, err := finalCheckpoint(ctx, nil, 311); err == nil || !strings.Contains(err.Error(), "no checkpoint store") {
		t.Fatalf("no store: %v", err)
	}
}
