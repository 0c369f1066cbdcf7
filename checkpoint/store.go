package checkpoint

import (
	"context"
	"errors"
	"time"
)

// Store is a flat namespace of immutable objects: where checkpoints live.
// Names are slash-separated and relative to the store's root (its bucket and
// prefix, or its directory).
type Store interface {
	// Put stores data under name. The object appears complete or not at
	// all, and an existing object is never replaced: a Put of an existing
	// name fails with a permanent error wrapping fs.ErrExist.
	Put(ctx context.Context, name string, data []byte) error
	// ReadAt fills p from the object's bytes starting at off; a short
	// object is an error.
	ReadAt(ctx context.Context, name string, p []byte, off int64) error
	// List returns the objects whose names start with prefix.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// Delete removes an object; a missing one is not an error.
	Delete(ctx context.Context, name string) error
	// Location names the store for people: its URL without credentials.
	Location() string
}

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Name     string
	Size     int64
	Modified time.Time
}

// ErrNotFound is returned (wrapped) for an object that does not exist.
var ErrNotFound = errors.New("object not found")

// permanentError marks a store error that retrying cannot mend (a missing
// object, a refused credential, a bad request).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// isPermanent reports whether err should not be retried.
func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p) || errors.Is(err, ErrNotFound) || errors.Is(err, context.Canceled)
}
