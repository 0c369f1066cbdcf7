package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// LocalStore keeps objects as files under a directory. A Put writes a
// temporary file, syncs it and links it into place, so an object is complete
// or absent and an existing one is never replaced.
type LocalStore struct {
	root string
}

// tmpPrefix starts the names of files being written.
const tmpPrefix = ".tmp-"

// NewLocalStore opens (creating when needed) the directory dir.
func NewLocalStore(dir string) (*LocalStore, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: directory %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: directory %q: %w", dir, permanent(err))
	}
	return &LocalStore{root: abs}, nil
}

// Location is the directory.
func (s *LocalStore) Location() string { return s.root }

func (s *LocalStore) path(name string) (string, error) {
	if name == "" || strings.HasPrefix(name, "/") || strings.Contains(name, "\\") {
		return "", permanent(fmt.Errorf("checkpoint: object name %q is not a relative slash-separated name", name))
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." || strings.HasPrefix(part, tmpPrefix) {
			return "", permanent(fmt.Errorf("checkpoint: object name %q has an empty, dot or temporary component", name))
		}
	}
	return filepath.Join(s.root, filepath.FromSlash(name)), nil
}

// Put writes data under name.
func (s *LocalStore) Put(ctx context.Context, name string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := s.path(name)
	if err != nil {
		return err
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("checkpoint: put %s: %w", name, permanent(err))
	}
	var nonce [6]byte
	rand.Read(nonce[:])
	tmp := filepath.Join(dir, tmpPrefix+filepath.Base(p)+"-"+hex.EncodeToString(nonce[:]))
	if err := writeSynced(tmp, data); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("checkpoint: put %s: %w", name, permanent(err))
	}
	defer os.Remove(tmp)
	// A hard link fails when the name exists: nothing is replaced.
	if err := os.Link(tmp, p); err != nil {
		return fmt.Errorf("checkpoint: put %s: %w", name, permanent(err))
	}
	return syncDir(dir)
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return permanent(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("checkpoint: sync directory %s: %w", dir, permanent(err))
	}
	return nil
}

// ReadAt reads len(p) bytes of name from off.
func (s *LocalStore) ReadAt(ctx context.Context, name string, p []byte, off int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path, err := s.path(name)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: read %s: %w", name, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("checkpoint: read %s: %w", name, permanent(err))
	}
	defer f.Close()
	if _, err := f.ReadAt(p, off); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("checkpoint: read %s bytes [%d,%d): %w", name, off, off+int64(len(p)), permanent(err))
	}
	return nil
}

// List walks the directory for names under prefix.
func (s *LocalStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	err := filepath.WalkDir(s.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), tmpPrefix) {
			return nil
		}
		rel, err := filepath.Rel(s.root, path)
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if !strings.HasPrefix(name, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, ObjectInfo{Name: name, Size: info.Size(), Modified: info.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", s.root, err)
	}
	return out, nil
}

// Delete removes name, and its directory once empty.
func (s *LocalStore) Delete(ctx context.Context, name string) error {
	p, err := s.path(name)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint: delete %s: %w", name, permanent(err))
	}
	if dir := filepath.Dir(p); dir != s.root {
		os.Remove(dir) // fails while other objects remain, as meant
	}
	return nil
}
