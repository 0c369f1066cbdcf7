package mlp

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// LoadMNIST reads the IDX files of MNIST from dir: train-images-idx3-ubyte
// and train-labels-idx1-ubyte for the training set, t10k-* for the test set.
// Pixels are scaled to [0, 1].
func LoadMNIST(dir string) (train, test *Data, err error) {
	if train, err = loadIDX(filepath.Join(dir, "train-images-idx3-ubyte"), filepath.Join(dir, "train-labels-idx1-ubyte")); err != nil {
		return nil, nil, err
	}
	if test, err = loadIDX(filepath.Join(dir, "t10k-images-idx3-ubyte"), filepath.Join(dir, "t10k-labels-idx1-ubyte")); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

func loadIDX(images, labels string) (*Data, error) {
	img, err := readIDX(images, 0x803, 3)
	if err != nil {
		return nil, err
	}
	lab, err := readIDX(labels, 0x801, 1)
	if err != nil {
		return nil, err
	}
	if img.dims[0] != lab.dims[0] {
		return nil, fmt.Errorf("mlp: %s has %d images but %s has %d labels", images, img.dims[0], labels, lab.dims[0])
	}
	n, features := img.dims[0], img.dims[1]*img.dims[2]
	d := &Data{Features: features, Classes: 10, X: make([]float32, n*features), Y: make([]int32, n)}
	for i, v := range img.data {
		d.X[i] = float32(v) / 255
	}
	for i, v := range lab.data {
		if v > 9 {
			return nil, fmt.Errorf("mlp: %s: label %d of sample %d is not a digit", labels, v, i)
		}
		d.Y[i] = int32(v)
	}
	return d, nil
}

type idxFile struct {
	dims []int
	data []byte
}

// readIDX reads an unsigned-byte IDX file with the given magic number.
func readIDX(path string, magic uint32, ndims int) (*idxFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mlp: %w", err)
	}
	defer f.Close()
	hdr := make([]byte, 4+4*ndims)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, fmt.Errorf("mlp: %s: header: %w", path, err)
	}
	if got := binary.BigEndian.Uint32(hdr); got != magic {
		return nil, fmt.Errorf("mlp: %s: magic %#x, want %#x (an IDX file of %d dimensions)", path, got, magic, ndims)
	}
	out := &idxFile{dims: make([]int, ndims)}
	size := 1
	for i := range ndims {
		d := int(binary.BigEndian.Uint32(hdr[4+4*i:]))
		if d <= 0 || d > 1<<26 {
			return nil, fmt.Errorf("mlp: %s: dimension %d is %d", path, i, d)
		}
		out.dims[i] = d
		size *= d
	}
	if size > 1<<31 {
		return nil, fmt.Errorf("mlp: %s: %d bytes of data is too large", path, size)
	}
	out.data = make([]byte, size)
	if _, err := io.ReadFull(f, out.data); err != nil {
		return nil, fmt.Errorf("mlp: %s: want %d bytes of data: %w", path, size, err)
	}
	return out, nil
}
