package gpt

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/phalanx-rt/phalanx/worker"
)

// Vocab is the model's vocabulary: the 256 byte values. Go source is
// almost all ASCII, so a byte is a character.
const Vocab = 256

// Corpus is text split into a training part and a held-out part.
type Corpus struct {
	Train, Heldout []byte
	Source         string // where it came from, for messages
}

// heldoutEvery: every tenth file of the Go source (or the last tenth of a
// --data file) is held out.
const heldoutEvery = 10

// GoSource reads the Go standard library's source under goroot/src: its
// .go files outside testdata directories, in lexical path order, every
// stride-th of them so that about limit bytes are read (all when limit
// is 0). Every tenth file read is held out; the others are training text.
// The split depends only on the tree, so every process of a job (and
// every run on the same Go) gets the same.
func GoSource(goroot string, limit int64) (*Corpus, error) {
	root := filepath.Join(goroot, "src")
	type file struct {
		path string
		size int64
	}
	var files []file
	var total int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".go") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files = append(files, file{path, info.Size()})
		total += info.Size()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gpt: reading the Go source under %s: %w", root, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("gpt: no .go files under %s: is GOROOT %q right?", root, goroot)
	}
	stride := int64(1)
	if limit > 0 && total > limit {
		stride = (total + limit - 1) / limit
	}
	c := &Corpus{Source: fmt.Sprintf("the Go source under %s", root)}
	n := 0
	for i, f := range files {
		if int64(i)%stride != 0 {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("gpt: %w", err)
		}
		if n%heldoutEvery == heldoutEvery-1 {
			c.Heldout = append(c.Heldout, b...)
		} else {
			c.Train = append(c.Train, b...)
		}
		n++
	}
	return c, nil
}

// ErrNotText is a --data file that is not text.
var ErrNotText = errors.New("not text")

// ReadText reads a text file as a corpus: its last tenth (from a line
// start) is held out. An empty file, or one that is not UTF-8 text (NUL
// bytes, invalid sequences), is an error naming the file and where.
func ReadText(path string) (*Corpus, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gpt: --data: %w", err)
	}
	if err := CheckText(path, b); err != nil {
		return nil, err
	}
	cut := len(b) - len(b)/heldoutEvery
	if nl := bytes.IndexByte(b[cut:], '\n'); nl >= 0 && cut+nl+1 < len(b) {
		cut += nl + 1
	}
	return &Corpus{Train: b[:cut], Heldout: b[cut:], Source: path}, nil
}

// CheckText is an error when b (the contents of path) is empty or not
// UTF-8 text.
func CheckText(path string, b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("gpt: --data %s: the file is empty", path)
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return fmt.Errorf("gpt: --data %s: %w: a NUL byte at offset %d", path, ErrNotText, i)
	}
	if !utf8.Valid(b) {
		at := 0
		for at < len(b) {
			r, n := utf8.DecodeRune(b[at:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			at += n
		}
		return fmt.Errorf("gpt: --data %s: %w: invalid UTF-8 at offset %d", path, ErrNotText, at)
	}
	return nil
}

// Windows is training or held-out text as samples: sample i is the
// Context+1 bytes from offset i·Context (the inputs, and each input's
// next byte). Fill puts a batch's bytes in Batch.IDs, Context+1 per
// sample.
type Windows struct {
	Text    []byte
	Context int
	// Limit, when positive, is the most samples (the held-out windows
	// scored at the end).
	Limit int
}

// Len is the number of whole windows.
func (w *Windows) Len() int {
	n := 0
	if len(w.Text) > w.Context {
		n = (len(w.Text) - 1) / w.Context
	}
	if w.Limit > 0 {
		n = min(n, w.Limit)
	}
	return n
}

// Fill puts samples idx in b: no features, Context+1 ids each.
func (w *Windows) Fill(idx []int, b *worker.Batch) error {
	b.Reset(len(idx), 0)
	n := w.Len()
	for _, i := range idx {
		if i < 0 || i >= n {
			return fmt.Errorf("gpt: window %d of %d", i, n)
		}
		for _, c := range w.Text[i*w.Context : i*w.Context+w.Context+1] {
			b.IDs = append(b.IDs, int32(c))
		}
	}
	return nil
}
