package gpt

import (
	"slices"
	"testing"

	"github.com/phalanx-rt/phalanx/worker"
)

// TestStaged: the staged form's layers describe what Build makes (each
// layer's parameter count, in all the whole model's), every parameter
// named as the whole model's; its token rows are each window's ids and
// the ids after them.
func TestStaged(t *testing.T) {
	o, err := Spec().Resolve(map[string]string{"width": "16", "depth": "2", "heads": "4", "context": "8"})
	if err != nil {
		t.Fatal(err)
	}
	m := Staged()
	desc, err := m.Layers(o)
	if err != nil {
		t.Fatal(err)
	}
	built, err := m.Build(o, 1, 0, len(desc))
	if err != nil || len(built) != len(desc) {
		t.Fatalf("built %d layers for %d described (%v)", len(built), len(desc), err)
	}
	var names []string
	var total int64
	for i, l := range built {
		var n int64
		for _, p := range l.Params() {
			n += int64(len(p.Value))
			names = append(names, p.Name)
		}
		if n != desc[i].Params {
			t.Errorf("layer %s: %d parameters built, %d described", desc[i].Name, n, desc[i].Params)
		}
		total += n
	}
	whole, _ := New(small, 1, nil)
	var want []string
	for _, p := range whole.Params() {
		want = append(want, p.Name)
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) || total != small.Params() {
		t.Errorf("staged parameters %v (%d values), the whole model's %v (%d)", names, total, want, small.Params())
	}
	if got := m.SampleRows(o); got != 8 {
		t.Errorf("%d rows a sample, want the context, 8", got)
	}

	text := []byte("abcdefghijklmnopqrstuvwxyz")
	rows := &tokenRows{&Windows{Text: text, Context: 8}}
	var b worker.Batch
	if err := rows.Fill([]int{2, 0}, &b); err != nil {
		t.Fatal(err)
	}
	if len(b.X) != 16 || len(b.Labels) != 16 || b.X[0] != 'q' || b.Labels[0] != 'r' || b.X[15] != 'h' || b.Labels[15] != 'i' {
		t.Errorf("token rows of windows 2 and 0: X %v, labels %v", b.X, b.Labels)
	}
	if err := rows.Fill([]int{3}, &b); err == nil {
		t.Error("window 3 of 3 filled")
	}
}
