package mlp

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The synthetic set: 5 images of 4x3 pixels per split.
const (
	testImages = 5
	testRows   = 4
	testCols   = 3
)

var testLabels = []byte{7, 0, 9, 3, 3}

func testPixels() []byte {
	p := make([]byte, testImages*testRows*testCols)
	for i := range p {
		p[i] = byte(i*37 + 11)
	}
	return p
}

func idxBytes(magic uint32, dims []uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, magic)
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	return append(b, data...)
}

func gzipBytes(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// writeIDX writes an IDX file as dir/name, or gzipped as dir/name.gz.
func writeIDX(t *testing.T, dir, name string, gz bool, magic uint32, dims []uint32, data []byte) {
	t.Helper()
	b := idxBytes(magic, dims, data)
	if gz {
		name += ".gz"
		b = gzipBytes(t, b)
	}
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeSet writes the four files of the synthetic set into dir; gz says, per
// file in the order of mnistFiles, whether it is gzipped.
func writeSet(t *testing.T, dir string, gz [4]bool) {
	t.Helper()
	for i, name := range mnistFiles() {
		if i%2 == 0 {
			writeIDX(t, dir, name, gz[i], imagesMagic, []uint32{testImages, testRows, testCols}, testPixels())
		} else {
			writeIDX(t, dir, name, gz[i], labelsMagic, []uint32{testImages}, testLabels)
		}
	}
}

func mnistFiles() []string {
	var names []string
	for _, s := range mnistSplits() {
		names = append(names, s.images, s.labels)
	}
	return names
}

var (
	allPlain = [4]bool{}
	allGzip  = [4]bool{true, true, true, true}
)

func TestLoadMNISTForms(t *testing.T) {
	pixels := testPixels()
	for _, tc := range []struct {
		name string
		gz   [4]bool
	}{
		{"plain", allPlain},
		{"gzip", allGzip},
		{"mixed", [4]bool{true, false, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSet(t, dir, tc.gz)
			if err := CheckMNIST(dir); err != nil {
				t.Fatalf("CheckMNIST: %v", err)
			}
			train, test, err := LoadMNIST(dir)
			if err != nil {
				t.Fatalf("LoadMNIST: %v", err)
			}
			for _, d := range []*Data{train, test} {
				if d.Len() != testImages || d.Features != testRows*testCols || d.Classes != 10 {
					t.Fatalf("loaded %d samples of %d features and %d classes, want %d of %d and 10",
						d.Len(), d.Features, d.Classes, testImages, testRows*testCols)
				}
				for i, v := range pixels {
					if want := float32(v) / 255; d.X[i] != want {
						t.Fatalf("pixel %d is %v, want %v", i, d.X[i], want)
					}
				}
				for i, v := range testLabels {
					if d.Y[i] != int32(v) {
						t.Fatalf("label %d is %d, want %d", i, d.Y[i], v)
					}
				}
			}
		})
	}
}

func TestLoadMNISTPlainAndGzipAgree(t *testing.T) {
	plain, gz := t.TempDir(), t.TempDir()
	writeSet(t, plain, allPlain)
	writeSet(t, gz, allGzip)
	ptrain, ptest, err := LoadMNIST(plain)
	if err != nil {
		t.Fatal(err)
	}
	gtrain, gtest, err := LoadMNIST(gz)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ptrain, gtrain) || !reflect.DeepEqual(ptest, gtest) {
		t.Errorf("plain and gzipped files load differently:\n%+v\n%+v", ptrain, gtrain)
	}
}

// TestMNISTBadFiles breaks one file of a valid set at a time: CheckMNIST
// (unless checkPasses) and LoadMNIST must both fail naming that file and the
// problem.
func TestMNISTBadFiles(t *testing.T) {
	pixels := testPixels()
	imgDims := []uint32{testImages, testRows, testCols}
	rewrite := func(name string, f func(b []byte) []byte) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			path := filepath.Join(dir, name)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, f(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name        string
		gz          [4]bool
		breakIt     func(t *testing.T, dir string)
		file        string // the file the error must name
		problem     string // and a word of the problem
		checkPasses bool   // a problem only reading the data finds
		notExist    bool
	}{
		{
			name: "missing labels", gz: allGzip,
			breakIt: func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "train-labels-idx1-ubyte.gz")) },
			file:    "neither train-labels-idx1-ubyte nor train-labels-idx1-ubyte.gz", problem: "does not exist", notExist: true,
		},
		{
			name: "missing plain labels", gz: allPlain,
			breakIt: func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "t10k-labels-idx1-ubyte")) },
			file:    "neither t10k-labels-idx1-ubyte nor t10k-labels-idx1-ubyte.gz", problem: "does not exist", notExist: true,
		},
		{
			name: "gz cut in its data", gz: allGzip,
			breakIt: rewrite("t10k-images-idx3-ubyte.gz", func(b []byte) []byte { return b[:len(b)*2/3] }),
			file:    "t10k-images-idx3-ubyte.gz", problem: "truncated",
		},
		{
			name: "gz without its trailer", gz: allGzip,
			breakIt: rewrite("train-images-idx3-ubyte.gz", func(b []byte) []byte { return b[:len(b)-8] }),
			file:    "train-images-idx3-ubyte.gz", problem: "truncated",
		},
		{
			name: "gz cut in its header", gz: allGzip,
			breakIt: rewrite("train-labels-idx1-ubyte.gz", func(b []byte) []byte { return b[:5] }),
			file:    "train-labels-idx1-ubyte.gz", problem: "truncated in its gzip header",
		},
		{
			name: "plain cut in its header", gz: allPlain,
			breakIt: rewrite("t10k-labels-idx1-ubyte", func(b []byte) []byte { return b[:6] }),
			file:    "t10k-labels-idx1-ubyte", problem: "truncated in its IDX header",
		},
		{
			name: "gz checksum", gz: allGzip,
			breakIt: rewrite("t10k-labels-idx1-ubyte.gz", func(b []byte) []byte {
				b[len(b)-8] ^= 0xff
				return b
			}),
			file: "t10k-labels-idx1-ubyte.gz", problem: "checksum", checkPasses: true,
		},
		{
			name: "not gzip", gz: allGzip,
			breakIt: rewrite("train-images-idx3-ubyte.gz", func(b []byte) []byte { return idxBytes(imagesMagic, imgDims, pixels) }),
			file:    "train-images-idx3-ubyte.gz", problem: "not a gzip file",
		},
		{
			name: "plain truncated", gz: allPlain,
			breakIt: rewrite("train-images-idx3-ubyte", func(b []byte) []byte { return b[:len(b)-7] }),
			file:    "train-images-idx3-ubyte", problem: "truncated",
		},
		{
			name: "wrong magic", gz: allGzip,
			breakIt: func(t *testing.T, dir string) {
				writeIDX(t, dir, "train-labels-idx1-ubyte", true, imagesMagic, []uint32{testImages}, testLabels)
			},
			file: "train-labels-idx1-ubyte.gz", problem: "magic 0x803, want 0x801",
		},
		{
			name: "zero dimension", gz: allPlain,
			breakIt: func(t *testing.T, dir string) {
				writeIDX(t, dir, "t10k-images-idx3-ubyte", false, imagesMagic, []uint32{testImages, 0, testCols}, nil)
			},
			file: "t10k-images-idx3-ubyte", problem: "dimension 1 is 0",
		},
		{
			name: "count mismatch", gz: allGzip,
			breakIt: func(t *testing.T, dir string) {
				writeIDX(t, dir, "t10k-labels-idx1-ubyte", true, labelsMagic, []uint32{testImages - 1}, testLabels[1:])
			},
			file: "t10k-labels-idx1-ubyte.gz", problem: "has 5 images but",
		},
		{
			name: "test images of another size", gz: allGzip,
			breakIt: func(t *testing.T, dir string) {
				writeIDX(t, dir, "t10k-images-idx3-ubyte", true, imagesMagic, []uint32{testImages, testCols, testCols}, pixels[:testImages*testCols*testCols])
			},
			file: "t10k-images-idx3-ubyte.gz", problem: "images of 3x3 pixels, but the training images have 12",
		},
		{
			name: "trailing data", gz: allGzip,
			breakIt: func(t *testing.T, dir string) {
				writeIDX(t, dir, "train-labels-idx1-ubyte", true, labelsMagic, []uint32{testImages}, append(testLabels[:testImages:testImages], 1))
			},
			file: "train-labels-idx1-ubyte.gz", problem: "not this file",
		},
		{
			name: "plain trailing data", gz: allPlain,
			breakIt: func(t *testing.T, dir string) {
				writeIDX(t, dir, "t10k-images-idx3-ubyte", false, imagesMagic, imgDims, append(pixels, 1, 2))
			},
			file: "t10k-images-idx3-ubyte", problem: "not this file",
		},
		{
			name: "not a digit", gz: allPlain,
			breakIt: func(t *testing.T, dir string) {
				writeIDX(t, dir, "train-labels-idx1-ubyte", false, labelsMagic, []uint32{testImages}, []byte{1, 12, 2, 3, 4})
			},
			file: "train-labels-idx1-ubyte", problem: "label 12 of sample 1 is not a digit", checkPasses: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSet(t, dir, tc.gz)
			tc.breakIt(t, dir)
			check := CheckMNIST(dir)
			_, _, load := LoadMNIST(dir)
			for _, r := range []struct {
				fn   string
				err  error
				pass bool
			}{{"CheckMNIST", check, tc.checkPasses}, {"LoadMNIST", load, false}} {
				if r.pass {
					if r.err != nil {
						t.Errorf("%s: %v, want no error (a problem only reading the data finds)", r.fn, r.err)
					}
					continue
				}
				if r.err == nil {
					t.Errorf("%s: no error, want one naming %s", r.fn, tc.file)
					continue
				}
				msg := r.err.Error()
				if !strings.Contains(msg, dir) || !strings.Contains(msg, tc.file) || !strings.Contains(msg, tc.problem) {
					t.Errorf("%s: %q, want an error naming %s in %s and %q", r.fn, msg, tc.file, dir, tc.problem)
				}
				if got := errors.Is(r.err, fs.ErrNotExist); got != tc.notExist {
					t.Errorf("%s: errors.Is(%v, fs.ErrNotExist) = %v, want %v", r.fn, r.err, got, tc.notExist)
				}
			}
		})
	}
}

// fashionMNISTDir is where scripts/install-fashion-mnist puts Fashion-MNIST.
const fashionMNISTDir = "/usr/share/datasets/fashion-mnist"

func TestFashionMNIST(t *testing.T) {
	if _, err := os.Stat(fashionMNISTDir); err != nil {
		// scripts/test installs it, so under CI its absence is a failure.
		if os.Getenv("CI") == "true" {
			t.Fatalf("Fashion-MNIST is not installed (%v): run scripts/install-fashion-mnist (CI=true: this test must run)", err)
		}
		t.Skipf("SKIPPED: Fashion-MNIST is not installed (%v); run scripts/install-fashion-mnist to test the real dataset", err)
	}
	if err := CheckMNIST(fashionMNISTDir); err != nil {
		t.Fatalf("CheckMNIST: %v", err)
	}
	if testing.Short() {
		t.Skip("-short: checked the headers of Fashion-MNIST, not loading its 70,000 images")
	}
	train, test, err := LoadMNIST(fashionMNISTDir)
	if err != nil {
		t.Fatalf("LoadMNIST: %v", err)
	}
	for _, tc := range []struct {
		name string
		d    *Data
		n    int
	}{{"training", train, 60000}, {"test", test, 10000}} {
		if tc.d.Len() != tc.n || tc.d.Features != 784 || tc.d.Classes != 10 {
			t.Errorf("%s set: %d samples of %d features and %d classes, want %d of 784 and 10",
				tc.name, tc.d.Len(), tc.d.Features, tc.d.Classes, tc.n)
		}
		var count [10]int
		for _, y := range tc.d.Y {
			count[y]++
		}
		for c, k := range count {
			if k != tc.n/10 {
				t.Errorf("%s set: %d samples of class %d, want %d (Fashion-MNIST is balanced)", tc.name, k, c, tc.n/10)
			}
		}
	}
}
