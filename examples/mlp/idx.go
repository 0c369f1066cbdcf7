package mlp

import (
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// IDX magic numbers of unsigned-byte files: 0x08 (ubyte) then the number of dimensions.
const (
	imagesMagic = 0x803
	labelsMagic = 0x801
)

// mnistSplit names the two IDX files of one split, without ".gz".
type mnistSplit struct {
	name, images, labels string
}

func mnistSplits() [2]mnistSplit {
	return [2]mnistSplit{
		{"training", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"},
		{"test", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"},
	}
}

// LoadMNIST reads the IDX files of MNIST (or Fashion-MNIST) from dir:
// train-images-idx3-ubyte and train-labels-idx1-ubyte for the training set,
// t10k-* for the test set, each either plain or gzipped with ".gz" appended
// (the plain file wins when both are there). Pixels are scaled to [0, 1].
// Errors name the file and the problem.
func LoadMNIST(dir string) (train, test *Data, err error) {
	splits := mnistSplits()
	if train, err = loadSplit(dir, splits[0], 0); err != nil {
		return nil, nil, err
	}
	if test, err = loadSplit(dir, splits[1], train.Features); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

// CheckMNIST verifies cheaply, without reading the data, that dir holds the
// four files LoadMNIST reads, plain or gzipped, and that their headers agree:
// magic numbers, as many labels as images in each split, the same image size
// in both splits, and each file as long as its header says (for a gzipped
// file, the uncompressed length its gzip trailer records). It returns an
// error naming the first missing or bad file; a missing file's error wraps
// fs.ErrNotExist. Pixel values, label values and gzip checksums are left to
// LoadMNIST, which reads everything.
func CheckMNIST(dir string) error {
	features := 0
	for _, s := range mnistSplits() {
		f, err := checkSplit(dir, s, features)
		if err != nil {
			return err
		}
		features = f
	}
	return nil
}

// checkSplit checks the headers of a split's files and returns its number of
// features. wantFeatures, when not 0, is the training set's.
func checkSplit(dir string, s mnistSplit, wantFeatures int) (int, error) {
	img, err := openIDX(dir, s.images, imagesMagic, 3)
	if err != nil {
		return 0, err
	}
	defer img.Close()
	if err := img.checkLength(); err != nil {
		return 0, err
	}
	features, err := img.features(wantFeatures)
	if err != nil {
		return 0, err
	}
	lab, err := openIDX(dir, s.labels, labelsMagic, 1)
	if err != nil {
		return 0, err
	}
	defer lab.Close()
	if err := lab.checkLength(); err != nil {
		return 0, err
	}
	if err := sameCount(img, lab); err != nil {
		return 0, err
	}
	return features, nil
}

// loadSplit reads a split. wantFeatures, when not 0, is the training set's.
func loadSplit(dir string, s mnistSplit, wantFeatures int) (*Data, error) {
	img, err := openIDX(dir, s.images, imagesMagic, 3)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	features, err := img.features(wantFeatures)
	if err != nil {
		return nil, err
	}
	lab, err := openIDX(dir, s.labels, labelsMagic, 1)
	if err != nil {
		return nil, err
	}
	defer lab.Close()
	if err := sameCount(img, lab); err != nil {
		return nil, err
	}
	pixels, err := img.readData()
	if err != nil {
		return nil, err
	}
	labels, err := lab.readData()
	if err != nil {
		return nil, err
	}
	n := img.dims[0]
	d := &Data{Features: features, Classes: 10, X: make([]float32, n*features), Y: make([]int32, n)}
	for i, v := range pixels {
		d.X[i] = float32(v) / 255
	}
	for i, v := range labels {
		if v > 9 {
			return nil, fmt.Errorf("mlp: %s: label %d of sample %d is not a digit", lab.path, v, i)
		}
		d.Y[i] = int32(v)
	}
	return d, nil
}

func sameCount(img, lab *idxReader) error {
	if img.dims[0] != lab.dims[0] {
		return fmt.Errorf("mlp: %s has %d images but %s has %d labels", img.path, img.dims[0], lab.path, lab.dims[0])
	}
	return nil
}

// idxReader is an open unsigned-byte IDX file, plain or gzipped, whose header
// has been read and validated; the data follows in r.
type idxReader struct {
	path string
	f    *os.File
	gz   *gzip.Reader // nil for a plain file
	r    io.Reader    // f or gz
	dims []int
	size int // bytes of data after the header
}

// openIDX opens dir/name, or else dir/name.gz, and reads its header, which
// must carry magic and ndims dimensions.
func openIDX(dir, name string, magic uint32, ndims int) (*idxReader, error) {
	x := &idxReader{path: filepath.Join(dir, name)}
	f, err := os.Open(x.path)
	gzipped := false
	if errors.Is(err, fs.ErrNotExist) {
		x.path, gzipped = x.path+".gz", true
		f, err = os.Open(x.path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("mlp: %s: found neither %s nor %s.gz: %w", dir, name, name, fs.ErrNotExist)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mlp: %w", err)
	}
	x.f, x.r = f, f
	if gzipped {
		if x.gz, err = gzip.NewReader(f); err != nil {
			f.Close()
			if truncated(err) {
				return nil, fmt.Errorf("mlp: %s: truncated in its gzip header: %w", x.path, err)
			}
			return nil, fmt.Errorf("mlp: %s: not a gzip file: %w", x.path, err)
		}
		x.r = x.gz
	}
	if err := x.readHeader(magic, ndims); err != nil {
		x.Close()
		return nil, err
	}
	return x, nil
}

func (x *idxReader) readHeader(magic uint32, ndims int) error {
	hdr := make([]byte, 4+4*ndims)
	if _, err := io.ReadFull(x.r, hdr); err != nil {
		if truncated(err) {
			return fmt.Errorf("mlp: %s: truncated in its IDX header of %d bytes: %w", x.path, len(hdr), err)
		}
		return fmt.Errorf("mlp: %s: IDX header: %w", x.path, err)
	}
	if got := binary.BigEndian.Uint32(hdr); got != magic {
		return fmt.Errorf("mlp: %s: magic %#x, want %#x (an IDX file of %d dimensions)", x.path, got, magic, ndims)
	}
	x.dims = make([]int, ndims)
	x.size = 1
	for i := range ndims {
		d := int(binary.BigEndian.Uint32(hdr[4+4*i:]))
		if d <= 0 || d > 1<<26 {
			return fmt.Errorf("mlp: %s: dimension %d is %d", x.path, i, d)
		}
		x.dims[i] = d
		x.size *= d
	}
	if x.size > 1<<31 {
		return fmt.Errorf("mlp: %s: %d bytes of data is too large", x.path, x.size)
	}
	return nil
}

// features is the number of pixels of an image; wantFeatures, when not 0, is
// the number the other split's images have.
func (x *idxReader) features(wantFeatures int) (int, error) {
	f := x.dims[1] * x.dims[2]
	if wantFeatures != 0 && f != wantFeatures {
		return 0, fmt.Errorf("mlp: %s: images of %dx%d pixels, but the training images have %d", x.path, x.dims[1], x.dims[2], wantFeatures)
	}
	return f, nil
}

// checkLength compares the file's length, or for a gzipped file the
// uncompressed length recorded in its trailer (modulo 2³², which the 2³¹
// bound on data makes exact; the last member's, for a multi-member file),
// with the length the header implies. It catches truncation without reading
// the data.
func (x *idxReader) checkLength() error {
	want := int64(4 + 4*len(x.dims) + x.size)
	fi, err := x.f.Stat()
	if err != nil {
		return fmt.Errorf("mlp: %w", err)
	}
	if x.gz == nil {
		switch {
		case fi.Size() < want:
			return fmt.Errorf("mlp: %s: truncated: %d bytes long, but its header implies %d", x.path, fi.Size(), want)
		case fi.Size() > want:
			return fmt.Errorf("mlp: %s: %d bytes long, but its header implies %d: not this file, or a damaged one", x.path, fi.Size(), want)
		}
		return nil
	}
	var isize [4]byte
	if _, err := x.f.ReadAt(isize[:], fi.Size()-4); err != nil {
		return fmt.Errorf("mlp: %s: gzip trailer: %w", x.path, err)
	}
	if got := int64(binary.LittleEndian.Uint32(isize[:])); got != want {
		return fmt.Errorf("mlp: %s: gzip trailer records %d bytes uncompressed, but the IDX header implies %d: truncated, or not this file", x.path, got, want)
	}
	return nil
}

// readData reads the data, and then requires the end of the file, where the
// gzip reader verifies its checksum.
func (x *idxReader) readData() ([]byte, error) {
	data := make([]byte, x.size)
	if n, err := io.ReadFull(x.r, data); err != nil {
		if truncated(err) {
			return nil, fmt.Errorf("mlp: %s: truncated: %d of the %d bytes of data its header implies: %w", x.path, n, x.size, err)
		}
		return nil, fmt.Errorf("mlp: %s: reading %d bytes of data: %w", x.path, x.size, err)
	}
	var extra [1]byte
	switch n, err := io.ReadFull(x.r, extra[:]); {
	case n > 0:
		return nil, fmt.Errorf("mlp: %s: longer than its header implies (%d bytes of data): not this file, or a damaged one", x.path, x.size)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, fmt.Errorf("mlp: %s: truncated after its %d bytes of data: %w", x.path, x.size, err)
	case err != io.EOF:
		return nil, fmt.Errorf("mlp: %s: after its %d bytes of data: %w", x.path, x.size, err)
	}
	return data, nil
}

func (x *idxReader) Close() error {
	if x.gz != nil {
		x.gz.Close()
	}
	return x.f.Close()
}

// truncated tells whether err from io.ReadFull, or from a gzip reader, means
// the file ended early.
func truncated(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}
