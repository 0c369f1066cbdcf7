package checkpoint

import (
	"context"
	"fmt"
	"strings"

	"github.com/phalanx-rt/phalanx/collective"
	"github.com/phalanx-rt/phalanx/proto/phalanxpb"
)

// ReadTensor fills dst with tensor name of checkpoint m, read from its
// segments and checked against each segment's CRC32C: a reader that needs
// a few tensors (a pipeline stage restored under other cuts) reads and
// verifies those alone. A missing tensor, one of another length, or bytes
// that do not match their checksum are errors naming it.
func ReadTensor(ctx context.Context, s Store, m *phalanxpb.Manifest, name string, dst []float32) error {
	var t *phalanxpb.Tensor
	for _, x := range m.Tensors {
		if x.Name == name {
			t = x
			break
		}
	}
	switch {
	case t == nil:
		return fmt.Errorf("checkpoint %s: no tensor %q", m.Id, name)
	case t.Bytes != uint64(4*len(dst)):
		return fmt.Errorf("checkpoint %s: tensor %q holds %d bytes, want %d", m.Id, name, t.Bytes, 4*len(dst))
	}
	buf := collective.Float32s(dst).Raw()
	var at uint64
	for _, seg := range t.Segments {
		if int(seg.Object) >= len(m.Objects) || at+seg.Bytes > t.Bytes {
			return &CorruptError{ID: m.Id, Object: "?", What: "tensor " + name, Reason: "a segment outside the checkpoint"}
		}
		o := m.Objects[seg.Object]
		part := buf[at : at+seg.Bytes]
		err := DefaultBackoff.do(ctx, func(ctx context.Context) error {
			return s.ReadAt(ctx, m.Id+"/"+o.Name, part, int64(seg.Offset))
		}, nil)
		if err != nil {
			return &CorruptError{ID: m.Id, Object: o.Name, What: "tensor " + name, Reason: err.Error()}
		}
		if crc(part) != seg.Crc32C {
			return &CorruptError{ID: m.Id, Object: o.Name, What: "tensor " + name, Reason: "CRC32C mismatch"}
		}
		at += seg.Bytes
	}
	if at != t.Bytes {
		return &CorruptError{ID: m.Id, Object: "?", What: "tensor " + name, Reason: fmt.Sprintf("segments hold %d of its %d bytes", at, t.Bytes)}
	}
	return nil
}

// Prefixed is s seen under prefix: names are prefix+name in s. Several
// writers that each keep checkpoints of their own (a pipeline's stages)
// share one store through it.
func Prefixed(s Store, prefix string) Store { return prefixed{s, prefix} }

type prefixed struct {
	s      Store
	prefix string
}

func (p prefixed) Put(ctx context.Context, name string, data []byte) error {
	return p.s.Put(ctx, p.prefix+name, data)
}

func (p prefixed) ReadAt(ctx context.Context, name string, b []byte, off int64) error {
	return p.s.ReadAt(ctx, p.prefix+name, b, off)
}

func (p prefixed) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	objs, err := p.s.List(ctx, p.prefix+prefix)
	for i := range objs {
		objs[i].Name = strings.TrimPrefix(objs[i].Name, p.prefix)
	}
	return objs, err
}

func (p prefixed) Delete(ctx context.Context, name string) error {
	return p.s.Delete(ctx, p.prefix+name)
}

func (p prefixed) Location() string { return strings.TrimSuffix(p.s.Location(), "/") + "/" + p.prefix }
