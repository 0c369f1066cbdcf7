package mlp

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeIDX(t *testing.T, path string, magic uint32, dims []uint32, data []byte) {
	t.Helper()
	b := binary.BigEndian.AppendUint32(nil, magic)
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	if err := os.WriteFile(path, append(b, data...), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadMNIST(t *testing.T) {
	dir := t.TempDir()
	pixels := make([]byte, 3*2*2)
	for i := range pixels {
		pixels[i] = byte(i * 20)
	}
	for _, prefix := range []string{"train", "t10k"} {
		writeIDX(t, filepath.Join(dir, prefix+"-images-idx3-ubyte"), 0x803, []uint32{3, 2, 2}, pixels)
		writeIDX(t, filepath.Join(dir, prefix+"-labels-idx1-ubyte"), 0x801, []uint32{3}, []byte{7, 0, 9})
	}
	train, test, err := LoadMNIST(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.Len() != 3 || test.Len() != 3 || train.Features != 4 || train.Y[2] != 9 || train.X[11] != float32(220)/255 {
		t.Errorf("loaded %+v", train)
	}

	bad := []struct {
		name  string
		write func(dir string)
		want  string
	}{
		{"wrong magic", func(d string) {
			writeIDX(t, filepath.Join(d, "train-images-idx3-ubyte"), 0x801, []uint32{3, 2, 2}, pixels)
		}, "magic"},
		{"truncated", func(d string) {
			writeIDX(t, filepath.Join(d, "train-images-idx3-ubyte"), 0x803, []uint32{3, 2, 2}, pixels[:5])
		}, "want 12 bytes"},
		{"count mismatch", func(d string) {
			writeIDX(t, filepath.Join(d, "train-labels-idx1-ubyte"), 0x801, []uint32{2}, []byte{1, 2})
		}, "3 images but"},
		{"not a digit", func(d string) {
			writeIDX(t, filepath.Join(d, "train-labels-idx1-ubyte"), 0x801, []uint32{3}, []byte{1, 12, 2})
		}, "not a digit"},
		{"missing", func(d string) { os.Remove(filepath.Join(d, "t10k-labels-idx1-ubyte")) }, "no such file"},
	}
	for _, tc := range bad {
		d := t.TempDir()
		for _, prefix := range []string{"train", "t10k"} {
			writeIDX(t, filepath.Join(d, prefix+"-images-idx3-ubyte"), 0x803, []uint32{3, 2, 2}, pixels)
			writeIDX(t, filepath.Join(d, prefix+"-labels-idx1-ubyte"), 0x801, []uint32{3}, []byte{7, 0, 9})
		}
		tc.write(d)
		if _, _, err := LoadMNIST(d); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}
